package partition

import (
	"fmt"

	"github.com/rejoin-db/rejoin/wire"
)

// Txn is the write path of one transaction: every change goes through it
// and leaves an undo entry, so a procedure that fails half way is rolled
// back to exactly the state before it began (same rows, same slots, same
// digest). Reads go straight to the tables.
//
// A Txn is reused by its executor across transactions; the undo buffers keep
// their capacity, so a steady workload allocates nothing per change.
type Txn struct {
	p *Partition
	// undo holds one entry per applied change, oldest first. Invariant:
	// applying the inverse of each entry, newest first, restores the
	// partition to its state at Begin.
	undo []undoEntry
	// saved holds the old tuples that undo entries point into, so an entry
	// does not cost a heap object of its own.
	saved []byte
	enc   *wire.TupleEncoder
	row   []wire.Value
}

type undoKind uint8

const (
	undoInsert undoKind = iota + 1 // slot was inserted: delete it
	undoUpdate                     // slot was updated: put the old tuple back
	undoDelete                     // slot was deleted: re-insert the old tuple there
)

type undoEntry struct {
	kind     undoKind
	table    *Table
	slot     Slot
	off, end int // the old tuple in Txn.saved
}

// NewTxn returns a transaction context over p.
func NewTxn(p *Partition) *Txn {
	return &Txn{p: p, enc: wire.NewTupleEncoder()}
}

// Partition returns the partition the transaction works on.
func (tx *Txn) Partition() *Partition { return tx.p }

// Begin starts a new transaction, forgetting the undo log of the last one.
func (tx *Txn) Begin() {
	tx.undo = tx.undo[:0]
	tx.saved = tx.saved[:0]
}

// Changes returns the number of changes applied since Begin.
func (tx *Txn) Changes() int { return len(tx.undo) }

// Table returns the table named name, or an error that names it.
func (tx *Txn) Table(name string) (*Table, error) {
	t := tx.p.TableByName(name)
	if t == nil {
		return nil, fmt.Errorf("%w: no table %q", ErrBadParams, name)
	}
	return t, nil
}

// Insert inserts row into t.
func (tx *Txn) Insert(t *Table, row []wire.Value) (Slot, error) {
	s, err := t.Insert(row)
	if err != nil {
		return 0, err
	}
	tx.undo = append(tx.undo, undoEntry{kind: undoInsert, table: t, slot: s})
	return s, nil
}

// Update replaces the row in slot s of t.
func (tx *Txn) Update(t *Table, s Slot, row []wire.Value) error {
	old := t.Tuple(s)
	if old == nil {
		return fmt.Errorf("%w: slot %d of table %q", ErrNoRow, s, t.Schema().Name)
	}
	off := len(tx.saved)
	tx.saved = append(tx.saved, old...)
	if err := t.Update(s, row); err != nil {
		tx.saved = tx.saved[:off]
		return err
	}
	tx.undo = append(tx.undo, undoEntry{kind: undoUpdate, table: t, slot: s, off: off, end: len(tx.saved)})
	return nil
}

// Delete deletes the row in slot s of t.
func (tx *Txn) Delete(t *Table, s Slot) error {
	old := t.Tuple(s)
	if old == nil {
		return fmt.Errorf("%w: slot %d of table %q", ErrNoRow, s, t.Schema().Name)
	}
	off := len(tx.saved)
	tx.saved = append(tx.saved, old...)
	if err := t.Delete(s); err != nil {
		tx.saved = tx.saved[:off]
		return err
	}
	tx.undo = append(tx.undo, undoEntry{kind: undoDelete, table: t, slot: s, off: off, end: len(tx.saved)})
	return nil
}

// Rollback undoes every change since Begin, newest first. The inverse
// changes reach the observer like any other, so a change log sees the
// rows come back. Undo cannot meet a constraint the forward change did not
// already satisfy, so an error here is a bug and panics.
func (tx *Txn) Rollback() {
	for i := len(tx.undo) - 1; i >= 0; i-- {
		u := tx.undo[i]
		var err error
		switch u.kind {
		case undoInsert:
			err = u.table.Delete(u.slot)
		case undoUpdate:
			err = u.table.UpdateTuple(u.slot, tx.saved[u.off:u.end])
		case undoDelete:
			err = u.table.InsertTupleAt(u.slot, tx.saved[u.off:u.end])
		}
		if err != nil {
			panic(fmt.Sprintf("partition: undo %d of table %q slot %d failed: %v", u.kind, u.table.Schema().Name, u.slot, err))
		}
	}
	tx.Begin()
}
