package partition

import (
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/rejoin-db/rejoin/wire"
)

// Route returns the partition, in [0, partitions), that owns the row whose
// primary key is key (the canonical key tuple, as Table.Lookup takes it).
// Every initiator and client routes with it, so a key lives in exactly one
// partition cluster-wide. It hashes the key's bytes with xxhash and maps
// the hash with jump consistent hashing (Lamping and Veach), which spreads
// keys evenly and, should the partition count ever grow from n to n+1,
// moves only about 1/(n+1) of them.
func Route(key []byte, partitions uint32) (uint32, error) {
	if partitions == 0 {
		return 0, fmt.Errorf("%w: route over zero partitions", ErrBadParams)
	}
	return jumpHash(xxhash.Sum64(key), partitions), nil
}

// RouteValues routes a key given as values; it encodes them as the
// canonical key tuple first, so it agrees with Route on the same key.
func RouteValues(key []wire.Value, partitions uint32) (uint32, error) {
	b, err := (&wire.TupleEncoder{}).AppendTuple(nil, key)
	if err != nil {
		return 0, fmt.Errorf("%w: route key: %w", ErrBadParams, err)
	}
	return Route(b, partitions)
}

// jumpHash is Lamping and Veach's jump consistent hash: the bucket in
// [0, n) of key, with the constant and shifts of their paper.
func jumpHash(key uint64, n uint32) uint32 {
	var b, j int64 = -1, 0
	for j < int64(n) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return uint32(b)
}
