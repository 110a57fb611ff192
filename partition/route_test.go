package partition

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/rejoin-db/rejoin/wire"
)

func TestRouteSpreadsAndIsStable(t *testing.T) {
	const keys, parts = 100_000, 16
	counts := make([]int, parts)
	moved := 0
	var k [8]byte
	for i := 0; i < keys; i++ {
		binary.BigEndian.PutUint64(k[:], uint64(i))
		key, _ := (&wire.TupleEncoder{}).AppendTuple(nil, []wire.Value{wire.Bytes(k[:])})
		p, err := Route(key, parts)
		if err != nil || p >= parts {
			t.Fatalf("Route = %d, %v", p, err)
		}
		if again, _ := Route(key, parts); again != p {
			t.Fatalf("Route is not deterministic: %d then %d", p, again)
		}
		counts[p]++
		// Growing to 17 partitions moves a key only into the new one.
		p17, _ := Route(key, parts+1)
		if p17 != p {
			if p17 != parts {
				t.Fatalf("key %d moved from %d to %d, not to the new partition", i, p, p17)
			}
			moved++
		}
	}
	for p, c := range counts {
		if c < keys/parts*9/10 || c > keys/parts*11/10 {
			t.Errorf("partition %d holds %d of %d keys; want within 10%% of %d", p, c, keys, keys/parts)
		}
	}
	if want := keys / (parts + 1); moved < want*8/10 || moved > want*12/10 {
		t.Errorf("growing to %d partitions moved %d keys, want about %d", parts+1, moved, want)
	}
}

func TestRouteValuesAgreesWithRoute(t *testing.T) {
	vals := []wire.Value{wire.String("eu"), wire.Int64(42)}
	key, _ := (&wire.TupleEncoder{}).AppendTuple(nil, vals)
	a, err1 := Route(key, 7)
	b, err2 := RouteValues(vals, 7)
	if err1 != nil || err2 != nil || a != b {
		t.Fatalf("Route %d (%v), RouteValues %d (%v)", a, err1, b, err2)
	}
	if _, err := Route(key, 0); !errors.Is(err, ErrBadParams) {
		t.Fatalf("zero partitions: %v, want ErrBadParams", err)
	}
	if _, err := RouteValues([]wire.Value{{}}, 7); !errors.Is(err, ErrBadParams) {
		t.Fatalf("invalid key value: %v, want ErrBadParams", err)
	}
}
