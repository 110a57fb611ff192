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
	types []wire.Type // a delete block's key types
	ends  []int       // where each key of the delete block being applied ends
}

// Apply applies block b to p: the rows of snapshot and upsert blocks are
// written by key with Table.UpsertTuples, and the keys of delete blocks
// removed with Table.DeleteKey, a key with no row being no error. Both are
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
	pos, n, err := a.checkHeader(t, b)
	if err != nil {
		return err
	}
	if b.Kind != wire.BlockDeletes {
		// The table checks every row before it writes any.
		if err := t.UpsertTuples(b.Tuples[pos:], n); err != nil {
			return fmt.Errorf("%w: %v block for table %q: %w", ErrBadBlock, b.Kind, t.Schema().Name, err)
		}
		return nil
	}
	if err := a.checkKeys(t, b, pos, n); err != nil {
		return err
	}
	// Validated: no delete below can fail, short of a bug.
	for i, end := range a.ends {
		key := b.Tuples[pos:end]
		pos = end
		if _, err := t.DeleteKey(key); err != nil {
			panic(fmt.Sprintf("cow: checked %v block for table %q failed at key %d of %d: %v", b.Kind, t.Schema().Name, i, len(a.ends), err))
		}
	}
	return nil
}

// checkHeader checks b's array header against its Count and returns where
// the first tuple starts and how many there are.
func (a *Applier) checkHeader(t *partition.Table, b Block) (pos, n int, err error) {
	if len(b.Tuples) == 0 && b.Count == 0 {
		return 0, 0, nil // an empty block, as wire.Block allows
	}
	n, pos, err = wire.ReadArrayHeader(b.Tuples)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %v block for table %q: tuple array header: %w", ErrBadBlock, b.Kind, t.Schema().Name, err)
	}
	if n != int(b.Count) {
		return 0, 0, fmt.Errorf("%w: %v block for table %q: Count %d, array header says %d", ErrBadBlock, b.Kind, t.Schema().Name, b.Count, n)
	}
	return pos, n, nil
}

// checkKeys checks that the n tuples of delete block b from pos are keys
// of table t and nothing follows them, leaving each key's end in a.ends.
func (a *Applier) checkKeys(t *partition.Table, b Block, pos, n int) error {
	sc := t.Schema()
	a.types = a.types[:0]
	for _, k := range sc.Key {
		a.types = append(a.types, sc.Columns[k].Type)
	}
	a.ends = a.ends[:0]
	for i := range n {
		l, err := wire.ScanTuple(b.Tuples[pos:], a.types, nil)
		if err != nil {
			return fmt.Errorf("%w: %v block for table %q: tuple %d at byte %d: %w", ErrBadBlock, b.Kind, sc.Name, i, pos, err)
		}
		if l > partition.TupleBytesMax {
			return fmt.Errorf("%w: %v block for table %q: tuple %d of %d bytes, limit %d: %w", ErrBadBlock, b.Kind, sc.Name, i, l, partition.TupleBytesMax, partition.ErrTupleTooLarge)
		}
		pos += l
		a.ends = append(a.ends, pos)
	}
	if pos != len(b.Tuples) {
		return fmt.Errorf("%w: %v block for table %q: %d bytes after %d tuples", ErrBadBlock, b.Kind, sc.Name, len(b.Tuples)-pos, n)
	}
	return nil
}
