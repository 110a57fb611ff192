package bench

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/rejoin-db/rejoin/bench/load"
	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

// kvTable is the table every rejoin workload uses: a bytes key and a bytes
// value, the shape of a key-value store such as Redis, the yardstick.
const kvTable = "kv"

func kvSchema() partition.Schema {
	return partition.Schema{
		Name:    kvTable,
		Columns: []partition.Column{{Name: "k", Type: wire.TypeBytes}, {Name: "v", Type: wire.TypeBytes}},
		Key:     []int{0},
	}
}

// keyBytesMin leaves room in a key for the row number that makes it
// unique.
const keyBytesMin = load.KeyBytesMin

// rowShape makes the keys and values of the workload. Keys are a pure
// function of the row number, so the writer can pick an existing row
// without a list of keys: the row number big-endian in the last 8 bytes
// (unique), a hash of it before that (so keys do not share prefixes).
//
// Values follow the wire benchmark's shape: the first 64% (rounded down to
// 16 bytes) repeat one of 16 fixed 16-byte patterns, the rest is random. A
// table of short repeated strings with a random tail, neither the best
// nor the worst case for a codec: S2 takes 100-byte values to about 45%.
type rowShape struct {
	keyBytes, valueBytes int
	patterned            int
	patterns             [16][16]byte
}

func newRowShape(keyBytes, valueBytes int, seed uint64) *rowShape {
	s := &rowShape{keyBytes: keyBytes, valueBytes: valueBytes, patterned: valueBytes * 64 / 100 &^ 15}
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range s.patterns {
		for j := range s.patterns[i] {
			s.patterns[i][j] = byte('a' + rng.IntN(26))
		}
	}
	return s
}

// key appends the key of row i to dst: bench/load's key shape, so the
// in-process rejoin and the cluster's load generator build the same keys.
func (s *rowShape) key(dst []byte, i uint64) []byte {
	return load.AppendKey(dst, i, s.keyBytes)
}

// value appends a fresh value to dst.
func (s *rowShape) value(dst []byte, rng *rand.Rand) []byte {
	p := &s.patterns[rng.IntN(len(s.patterns))]
	for n := 0; n < s.patterned; n += len(p) {
		dst = append(dst, p[:]...)
	}
	for n := s.patterned; n < s.valueBytes; n += 8 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], rng.Uint64())
		dst = append(dst, b[:min(8, s.valueBytes-n)]...)
	}
	return dst
}

// loadRows fills a new partition's kv table with rows 0..n-1.
func loadRows(shape *rowShape, n int, seed uint64) (*partition.Partition, error) {
	p := partition.New()
	tab, err := p.CreateTable(kvSchema())
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	key := make([]byte, 0, shape.keyBytes)
	val := make([]byte, 0, shape.valueBytes)
	row := make([]wire.Value, 2)
	for i := range n {
		key = shape.key(key[:0], uint64(i))
		val = shape.value(val[:0], rng)
		row[0], row[1] = wire.Bytes(key), wire.Bytes(val)
		if _, err := tab.Insert(row); err != nil {
			return nil, fmt.Errorf("bench: load row %d: %w", i, err)
		}
	}
	return p, nil
}
