package partition

import "github.com/cespare/xxhash/v2"

// RowHash is the digest contribution of one row: the 64-bit xxhash of its
// stored tuple, seeded with its table's ID, so that equal tuples in two
// tables count differently. A table's digest is the sum of RowHash over its
// rows, mod 2^64; see the package doc for why that is strong enough.
func RowHash(id TableID, tuple []byte) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(uint64(id))
	_, _ = d.Write(tuple) // never fails
	return d.Sum64()
}

// Digest returns the table's content digest: the sum, mod 2^64, of
// RowHash over its live rows. It is kept up to date by every write, so it
// costs nothing to read, and it depends only on the set of rows, not on
// the order of the writes that made it or on slot numbers. An empty table
// has digest 0.
func (t *Table) Digest() uint64 { return t.digest }

// Digest returns the partition's content digest: the sum, mod 2^64, of its
// tables' digests, i.e. of RowHash over every row of every table. Because
// RowHash is seeded with the table ID, moving a row to another table
// changes the digest.
func (p *Partition) Digest() uint64 {
	var d uint64
	for _, t := range p.tables {
		d += t.digest
	}
	return d
}

// recomputeDigest sums RowHash over the live rows from scratch, in
// O(rows); the running digest must always equal it.
func (t *Table) recomputeDigest() uint64 {
	var d uint64
	for s := Slot(0); s < t.hwm; s++ {
		if e := t.ent(s); e.n != 0 {
			d += RowHash(t.id, t.tupleAt(e))
		}
	}
	return d
}

// recomputeDigest is Digest computed from scratch over every row.
func (p *Partition) recomputeDigest() uint64 {
	var d uint64
	for _, t := range p.tables {
		d += t.recomputeDigest()
	}
	return d
}
