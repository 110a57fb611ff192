package partition

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rejoin-db/rejoin/wire"
)

// UpsertTuples ends where Upsert of the same tuples one by one ends: same
// rows in the same slots, same digest. The runs are longer than a batch,
// repeat keys within a run and hit rows already there, with the key read
// in place (kv) and built from two columns out of order (comp).
func TestUpsertTuplesMatchesUpsert(t *testing.T) {
	for _, c := range []struct {
		schema Schema
		row    func(rng *rand.Rand, k int) []wire.Value
	}{
		{kvSchema(), func(rng *rand.Rand, k int) []wire.Value {
			return kvRow(int64(k), fmt.Sprint(rng.IntN(1000)))
		}},
		{compSchema(), func(rng *rand.Rand, k int) []wire.Value {
			return []wire.Value{wire.Bytes(bytes.Repeat([]byte{byte(k)}, rng.IntN(40))), wire.Int64(int64(k % 7)), wire.Float64(rng.Float64()), wire.String(fmt.Sprint(k / 7))}
		}},
	} {
		t.Run(c.schema.Name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			_, batched := newTestTable(t, c.schema)
			_, single := newTestTable(t, c.schema)
			for round := range 20 {
				n := rng.IntN(3 * upsertBatchRows)
				var run []byte
				for range n {
					tuple := encode(t, c.row(rng, rng.IntN(50*(round+1)))...)
					run = append(run, tuple...)
					if _, err := single.Upsert(tuple); err != nil {
						t.Fatal(err)
					}
				}
				if err := batched.UpsertTuples(run, n); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				mustVerify(t, batched)
				if batched.Digest() != single.Digest() || batched.Len() != single.Len() || batched.SlotsLen() != single.SlotsLen() {
					t.Fatalf("round %d: %d rows in %d slots, digest %016x; one by one %d in %d, %016x", round,
						batched.Len(), batched.SlotsLen(), batched.Digest(), single.Len(), single.SlotsLen(), single.Digest())
				}
				for s := range single.SlotsLen() {
					if !bytes.Equal(batched.Tuple(s), single.Tuple(s)) {
						t.Fatalf("round %d: slot %d holds %x, one by one %x", round, s, batched.Tuple(s), single.Tuple(s))
					}
				}
			}
		})
	}
}

// A run that is not exactly count good tuples changes nothing, even when
// its fault comes after a batch's worth of good ones.
func TestUpsertTuplesRejects(t *testing.T) {
	p, tab := newTestTable(t, kvSchema())
	var good []byte
	for k := range 2 * upsertBatchRows {
		good = append(good, encode(t, kvRow(int64(k), "v")...)...)
	}
	if _, err := tab.Insert(kvRow(1, "old")); err != nil {
		t.Fatal(err)
	}
	n := 2 * upsertBatchRows
	long := encode(t, wire.Int64(-1), wire.String(string(make([]byte, TupleBytesMax))))
	for _, c := range []struct {
		name  string
		run   []byte
		count int
		want  error
	}{
		{"count above the tuples", good, n + 1, ErrSchema},
		{"count below the tuples", good, n - 1, ErrSchema},
		{"truncated last tuple", good[:len(good)-1], n, ErrSchema},
		{"row of another schema", append(bytes.Clone(good), encode(t, wire.Int64(1))...), n + 1, ErrSchema},
		{"tuple too large", append(bytes.Clone(good), long...), n + 1, ErrTupleTooLarge},
		{"more rows than a table holds", good, SlotsMax, ErrTableFull},
		{"negative count", nil, -1, ErrTableFull},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &recorder{}
			p.SetObserver(rec)
			defer p.SetObserver(nil)
			before := stateOf(p, tab, rec)
			if err := tab.UpsertTuples(c.run, c.count); !errors.Is(err, c.want) {
				t.Fatalf("UpsertTuples = %v, want %v", err, c.want)
			}
			if after := stateOf(p, tab, rec); after != before {
				t.Fatalf("a rejected run changed the table: %+v, was %+v", after, before)
			}
			mustVerify(t, tab)
		})
	}
}
