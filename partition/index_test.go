package partition

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rejoin-db/rejoin/wire"
)

// fieldLen must agree with wire.ScanTuple on every form of every type.
func TestFieldLenMatchesScanTuple(t *testing.T) {
	ints := []int64{0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	lens := []int{0, 1, 31, 32, 255, 256, 65535, 65536}
	types := []wire.Type{wire.TypeInt64, wire.TypeFloat64, wire.TypeString, wire.TypeBytes}
	enc := wire.NewTupleEncoder()
	offs := make([]int, len(types)+1)
	for _, iv := range ints {
		for _, l := range lens {
			vals := []wire.Value{wire.Int64(iv), wire.Float64(float64(iv)), wire.String(strings.Repeat("s", l)), wire.Bytes(make([]byte, l))}
			b, err := enc.AppendTuple(nil, vals)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := wire.ScanTuple(b, types, offs); err != nil {
				t.Fatal(err)
			}
			for i := range types {
				if got := fieldLen(b[offs[i]:]); got != offs[i+1]-offs[i] {
					t.Fatalf("int %d len %d field %d: fieldLen %d, ScanTuple %d", iv, l, i, got, offs[i+1]-offs[i])
				}
			}
		}
	}
}

// The index alone, with hashes chosen to collide and to wrap around the
// end of the bucket array, so backward-shift deletion meets every case.
func TestIndexCollisionsAndWrap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	ix := newPKIndex()
	live := map[Slot]uint32{}
	next := Slot(0)
	for step := range 5000 {
		if len(live) < 40 && (len(live) == 0 || rng.IntN(3) > 0) {
			// Homes crowd into the last few buckets and bucket 0.
			h := uint32(math.MaxUint32 - rng.Uint32N(1<<28))
			if rng.IntN(4) == 0 {
				h = rng.Uint32N(1 << 27)
			}
			ix.insert(h, next)
			live[next] = h
			next++
		} else {
			for s, h := range live {
				ix.remove(h, s)
				delete(live, s)
				break
			}
		}
		if err := ix.verify(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if ix.count != len(live) {
			t.Fatalf("step %d: count %d, want %d", step, ix.count, len(live))
		}
		for s, h := range live {
			if !ix.has(h, s) {
				t.Fatalf("step %d: slot %d (hash %08x) is not reachable", step, s, h)
			}
		}
	}
}

// has reports whether the bucket of slot s, with hash h, is reachable.
func (ix *pkIndex) has(h uint32, s Slot) bool {
	mask := uint32(len(ix.buckets) - 1)
	for i := h >> ix.shift; ix.buckets[i] != 0; i = (i + 1) & mask {
		if ix.buckets[i] == makeBucket(h, s) {
			return true
		}
	}
	return false
}
