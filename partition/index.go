package partition

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/rejoin-db/rejoin/wire"
)

// Limits of the primary key index.
const (
	// indexBucketsMin is the size of an empty table's index.
	indexBucketsMin = 16
	// The index doubles before more than indexLoadNum/indexLoadDen of its
	// buckets are full. Linear probing stays short below 3/4, and the
	// buckets cost 8 bytes each, 11 to 21 bytes per row.
	indexLoadNum, indexLoadDen = 3, 4
)

// pkIndex is the primary key index of one table: an open-addressing hash
// table with linear probing from key hash to slot, whose buckets hold no
// pointers and no key bytes.
//
// A bucket is uint64(h)<<32 | uint64(slot)+1, where h is the 32-bit hash of
// the row's key fields (keyHash); 0 is an empty bucket. A key's home
// bucket is h >> shift, the top bits of h, so doubling the table sends the
// bucket at i to 2i or 2i+1. Deletion shifts later buckets of the run back
// (no tombstones).
//
// Invariants: exactly one bucket per live slot of the table, holding the
// hash of that slot's current key; every bucket lies in the run of full
// buckets that starts at its home bucket (no empty bucket between home
// and it); count < len(buckets)*indexLoadNum/indexLoadDen.
type pkIndex struct {
	buckets []uint64
	shift   uint32 // 32 - log2(len(buckets))
	count   int
	// touched keeps what touch loaded, so the compiler cannot drop loads
	// whose only purpose is to bring buckets into the cache.
	touched uint64
}

func newPKIndex() pkIndex {
	return pkIndex{buckets: make([]uint64, indexBucketsMin), shift: 32 - log2(indexBucketsMin)}
}

func log2(n int) uint32 {
	b := uint32(0)
	for 1<<b < n {
		b++
	}
	return b
}

// keyHash hashes the key fields of a row: the canonical key tuple without
// its array header, which is the same for every key of a table.
func keyHash(fields []byte) uint32 { return uint32(xxhash.Sum64(fields)) }

func bucketHash(e uint64) uint32 { return uint32(e >> 32) }
func bucketSlot(e uint64) Slot   { return Slot(uint32(e) - 1) }
func makeBucket(h uint32, s Slot) uint64 {
	return uint64(h)<<32 | uint64(s+1)
}

// lookup returns the slot whose key fields equal fields, which hash to h.
func (ix *pkIndex) lookup(h uint32, fields []byte, t *Table) (Slot, bool) {
	mask := uint32(len(ix.buckets) - 1)
	for i := h >> ix.shift; ; i = (i + 1) & mask {
		e := ix.buckets[i]
		if e == 0 {
			return 0, false
		}
		if bucketHash(e) == h && t.slotKeyEqual(bucketSlot(e), fields) {
			return bucketSlot(e), true
		}
	}
}

// insert adds slot s under hash h. The caller has checked that no live row
// has the same key.
func (ix *pkIndex) insert(h uint32, s Slot) {
	if (ix.count+1)*indexLoadDen > len(ix.buckets)*indexLoadNum {
		ix.grow()
	}
	ix.place(makeBucket(h, s))
	ix.count++
}

func (ix *pkIndex) place(e uint64) {
	mask := uint32(len(ix.buckets) - 1)
	i := bucketHash(e) >> ix.shift
	for ix.buckets[i] != 0 {
		i = (i + 1) & mask
	}
	ix.buckets[i] = e
}

// reserve grows the index now if n more inserts would make it grow, so
// that none of them moves a bucket touch has loaded, nor rehashes the
// index again: it grows once, straight to the size the n need.
func (ix *pkIndex) reserve(n int) {
	size := len(ix.buckets)
	for (ix.count+n)*indexLoadDen > size*indexLoadNum {
		size *= 2
	}
	if size != len(ix.buckets) {
		ix.resize(size)
	}
}

// touch loads the home bucket of each row's key hash. A large index is far
// bigger than the caches, so each lookup misses to DRAM (and the TLB); one
// at a time, each waits for the last. These loads do not depend on one
// another, so the CPU keeps many of them in flight, and the lookups and
// inserts that follow find their buckets in the cache.
func (ix *pkIndex) touch(rows []batchRow) {
	var sum uint64
	for i := range rows {
		sum += ix.buckets[rows[i].h>>ix.shift]
	}
	ix.touched = sum
}

func (ix *pkIndex) grow() { ix.resize(2 * len(ix.buckets)) }

// resize rehashes the index into size buckets, a larger power of two.
func (ix *pkIndex) resize(size int) {
	old := ix.buckets
	ix.buckets = make([]uint64, size)
	ix.shift = 32 - log2(size)
	for _, e := range old {
		if e != 0 {
			ix.place(e)
		}
	}
}

// remove drops the bucket of slot s, whose key hashes to h. The bucket must
// exist: a live slot missing from the index is a broken invariant.
func (ix *pkIndex) remove(h uint32, s Slot) {
	mask := uint32(len(ix.buckets) - 1)
	want := makeBucket(h, s)
	i := h >> ix.shift
	for ix.buckets[i] != want {
		if ix.buckets[i] == 0 {
			panic(fmt.Sprintf("partition: index has no bucket for slot %d (hash %08x)", s, h))
		}
		i = (i + 1) & mask
	}
	// Backward shift: walk the run after the hole and pull back every
	// bucket whose home is not strictly between the hole and itself, so
	// that no bucket is left with an empty bucket between it and its home.
	j := i
	for {
		j = (j + 1) & mask
		e := ix.buckets[j]
		if e == 0 {
			break
		}
		home := bucketHash(e) >> ix.shift
		if (j-home)&mask >= (j-i)&mask {
			ix.buckets[i] = e
			i = j
		}
	}
	ix.buckets[i] = 0
	ix.count--
}

// fieldLen returns the length of the canonical msgpack field at the front
// of b. b comes from a stored tuple, which ScanTuple validated on its way
// in, so anything unexpected is a corrupted arena and panics.
func fieldLen(b []byte) int {
	c := b[0]
	switch {
	case c <= 0x7f || c >= 0xe0: // fixint
		return 1
	case c&0xe0 == 0xa0: // fixstr
		return 1 + int(c&0x1f)
	}
	switch c {
	case 0xcc, 0xd0:
		return 2
	case 0xcd, 0xd1:
		return 3
	case 0xce, 0xd2:
		return 5
	case 0xcf, 0xd3, 0xcb:
		return 9
	case 0xc4, 0xd9: // bin8, str8
		return 2 + int(b[1])
	case 0xc5, 0xda: // bin16, str16
		return 3 + int(binary.BigEndian.Uint16(b[1:]))
	case 0xc6, 0xdb: // bin32, str32
		return 5 + int(binary.BigEndian.Uint32(b[1:]))
	}
	panic(fmt.Sprintf("partition: stored tuple has field code 0x%02x", c))
}

// storedKeyFields returns the key fields of a stored tuple: a subslice of
// tuple when the key is a prefix of the columns, else the fields copied
// into *scratch.
func (t *Table) storedKeyFields(tuple []byte, scratch *[]byte) []byte {
	pos := t.tupleHdrLen
	if t.keyPrefix {
		start := pos
		for range t.schema.Key {
			pos += fieldLen(tuple[pos:])
		}
		return tuple[start:pos]
	}
	offs := t.storedOffs
	for i := 0; i <= t.keyColMax; i++ {
		offs[i] = pos
		pos += fieldLen(tuple[pos:])
	}
	offs[t.keyColMax+1] = pos
	b := (*scratch)[:0]
	for _, k := range t.schema.Key {
		b = append(b, tuple[offs[k]:offs[k+1]]...)
	}
	*scratch = b
	return b
}

// scannedKeyFields returns the key fields of tuple, whose field offsets
// ScanTuple left in t.offs: a subslice of tuple or t.keyBuf.
func (t *Table) scannedKeyFields(tuple []byte) []byte {
	if t.keyPrefix {
		return tuple[t.offs[0]:t.offs[len(t.schema.Key)]]
	}
	t.keyBuf = wire.AppendKey(t.keyBuf[:0], tuple, t.offs, t.schema.Key)
	return t.keyBuf[len(t.keyHdr):]
}

// slotKeyEqual reports whether the row in live slot s has key fields
// fields.
func (t *Table) slotKeyEqual(s Slot, fields []byte) bool {
	return bytes.Equal(t.storedKeyFields(t.tupleAt(t.ent(s)), &t.cmpBuf), fields)
}

// checkKey checks that key is one canonical key tuple of t and returns its
// fields.
func (t *Table) checkKey(key []byte) ([]byte, error) {
	n, err := wire.ScanTuple(key, t.keyTypes, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: table %q key: %w", ErrSchema, t.schema.Name, err)
	}
	if n != len(key) {
		return nil, fmt.Errorf("%w: table %q key: %d bytes after the key tuple", ErrSchema, t.schema.Name, len(key)-n)
	}
	return key[len(t.keyHdr):], nil
}

// verify checks the index's own invariants: count, load and that every
// bucket is reachable from its home bucket without crossing an empty one.
func (ix *pkIndex) verify() error {
	n := len(ix.buckets)
	if n < indexBucketsMin || n&(n-1) != 0 || 32-log2(n) != ix.shift {
		return fmt.Errorf("index: %d buckets with shift %d", n, ix.shift)
	}
	mask := uint32(n - 1)
	full := 0
	for i, e := range ix.buckets {
		if e == 0 {
			continue
		}
		full++
		for j := bucketHash(e) >> ix.shift; j != uint32(i); j = (j + 1) & mask {
			if ix.buckets[j] == 0 {
				return fmt.Errorf("index: bucket %d (home %d) is cut off by empty bucket %d", i, bucketHash(e)>>ix.shift, j)
			}
		}
	}
	if full != ix.count {
		return fmt.Errorf("index: %d full buckets, count %d", full, ix.count)
	}
	if ix.count*indexLoadDen > n*indexLoadNum {
		return fmt.Errorf("index: %d entries in %d buckets is over the load bound", ix.count, n)
	}
	return nil
}
