package cow

import (
	"fmt"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

// Apply applies one block of the table stream to the destination
// partition p; see Applier.Apply. It is for callers that apply a few
// blocks; a destination applying a whole stream keeps an Applier, which
// reuses its scratch space.
func Apply(p *partition.Partition, b Block) error {
	var a Applier
	return a.Apply(p, b)
}

// Applier is the destination side of the table stream: it applies blocks
// to the partition being rebuilt. The zero value is ready to use; it is
// not safe for concurrent use (nor is the partition).
type Applier struct {
	types []wire.Type // the block's tuple types: the table's columns, or its key's
	ends  []int       // where each tuple of the block being applied ends
}

// Apply applies block b to p: the rows of snapshot and upsert blocks are
// written by key with Table.Upsert, and the keys of delete blocks removed
// with Table.DeleteKey, a key with no row being no error. Both are
// idempotent, so a block applied twice (a resend after a lost ack) is
// harmless.
//
// The whole block is checked before anything is written: its kind, its
// table, its array header against Count, and every tuple against the
// table's schema (whole rows) or key (deletes), canonical form and length
// included. A block that fails changes nothing and returns an error
// wrapping ErrUnknownTable or ErrBadBlock.
func (a *Applier) Apply(p *partition.Partition, b Block) error {
	if !b.Kind.Valid() {
		return fmt.Errorf("%w: %v", ErrBadBlock, b.Kind)
	}
	t := p.Table(b.Table)
	if t == nil {
		return fmt.Errorf("%w: %v block for table %d", ErrUnknownTable, b.Kind, b.Table)
	}
	pos, err := a.check(t, b)
	if err != nil {
		return err
	}
	// Validated: no write below can fail, short of a bug. (Upsert of a
	// checked tuple meets no duplicate, since it updates the row with its
	// key; check made sure the table has room for every insert.)
	for i, end := range a.ends {
		tuple := b.Tuples[pos:end]
		pos = end
		var err error
		if b.Kind == wire.BlockDeletes {
			_, err = t.DeleteKey(tuple)
		} else {
			_, err = t.Upsert(tuple)
		}
		if err != nil {
			panic(fmt.Sprintf("cow: checked %v block for table %q failed at tuple %d of %d: %v", b.Kind, t.Schema().Name, i, len(a.ends), err))
		}
	}
	return nil
}

// check validates b for table t, leaving each tuple's end in a.ends, and
// returns where the first tuple starts.
func (a *Applier) check(t *partition.Table, b Block) (int, error) {
	sc := t.Schema()
	a.types = a.types[:0]
	if b.Kind == wire.BlockDeletes {
		for _, k := range sc.Key {
			a.types = append(a.types, sc.Columns[k].Type)
		}
	} else {
		for _, c := range sc.Columns {
			a.types = append(a.types, c.Type)
		}
	}
	a.ends = a.ends[:0]
	if len(b.Tuples) == 0 && b.Count == 0 {
		return 0, nil // an empty block, as wire.Block allows
	}
	n, start, err := wire.ReadArrayHeader(b.Tuples)
	if err != nil {
		return 0, fmt.Errorf("%w: %v block for table %q: tuple array header: %w", ErrBadBlock, b.Kind, sc.Name, err)
	}
	if n != int(b.Count) {
		return 0, fmt.Errorf("%w: %v block for table %q: Count %d, array header says %d", ErrBadBlock, b.Kind, sc.Name, b.Count, n)
	}
	if b.Kind != wire.BlockDeletes && t.Len()+n > partition.SlotsMax {
		return 0, fmt.Errorf("%w: %v block of %d rows for table %q with %d rows: %w", ErrBadBlock, b.Kind, n, sc.Name, t.Len(), partition.ErrTableFull)
	}
	pos := start
	for i := range n {
		l, err := wire.ScanTuple(b.Tuples[pos:], a.types, nil)
		if err != nil {
			return 0, fmt.Errorf("%w: %v block for table %q: tuple %d at byte %d: %w", ErrBadBlock, b.Kind, sc.Name, i, pos, err)
		}
		if l > partition.TupleBytesMax {
			return 0, fmt.Errorf("%w: %v block for table %q: tuple %d of %d bytes, limit %d: %w", ErrBadBlock, b.Kind, sc.Name, i, l, partition.TupleBytesMax, partition.ErrTupleTooLarge)
		}
		pos += l
		a.ends = append(a.ends, pos)
	}
	if pos != len(b.Tuples) {
		return 0, fmt.Errorf("%w: %v block for table %q: %d bytes after %d tuples", ErrBadBlock, b.Kind, sc.Name, len(b.Tuples)-pos, n)
	}
	return start, nil
}
