package cow

import (
	"fmt"
	"math"

	"github.com/rejoin-db/rejoin/partition"
)

// Log entry sizes, as changeLog.bytes counts them.
const (
	// dirtyEntryBytes is what one slot in the dirty set counts: its 4-byte
	// index in the dirty list.
	dirtyEntryBytes = 4
	// keyEntryOverheadBytes is what one deleted key counts beyond its own
	// bytes: its 4-byte end offset.
	keyEntryOverheadBytes = 4
)

// changeLog is what changed behind the snapshot cursor since S, or since
// the round before: the dirty set (slots inserted or updated) and the
// keys of the rows deleted, per table. A Stream holds two: the one being
// filled, and the one a round is shipping.
//
// Invariant (the change log's contract, over a Stream's two logs): every
// slot behind the cursor that changed since S (or since its entry was last
// cut into a block) is either in the dirty set or was deleted and its key
// is logged. Changes ahead of the cursor have no entry; the cursor reads
// them.
//
// Nothing here costs a Go heap object per entry: slots are a []Slot plus a
// bitset, keys are one byte buffer plus offsets.
type changeLog struct {
	// tables[i] is table ID i+1's part; it grows when a table first logs.
	tables []tableLog
	// bytes is the log's size as bounded by Config.ChangeLogBytesMax:
	// dirtyEntryBytes per slot in a dirty list and, per deleted key,
	// len(key) + keyEntryOverheadBytes. Invariant: it equals that sum over
	// the entries not yet cut into a block. The bitsets are not counted:
	// they are sized by the table (one bit per slot up to the highest
	// dirty one), not by the write rate, so they cannot grow without bound
	// while the table does not.
	bytes int
}

// tableLog is one table's part of a change log.
type tableLog struct {
	// dirty lists the dirty slots in the order they joined the set.
	// Invariant: bit s of member is set exactly when s is in dirty and not
	// yet cut into a block, so a slot is listed at most once per log.
	dirty  []partition.Slot
	member []uint64
	// keys holds the deleted keys back to back; key i is
	// keys[keyEnds[i-1]:keyEnds[i]] (keyEnds[-1] taken as 0). A key
	// deleted, reinserted and deleted again behind the cursor is listed
	// twice; each copy is shipped or dropped by the same rule, and a
	// repeated delete by key is harmless.
	keys    []byte
	keyEnds []uint32
}

// table returns table id's part, growing the log to hold it.
func (l *changeLog) table(id partition.TableID) *tableLog {
	i := int(id) - 1
	if i >= len(l.tables) {
		l.tables = append(l.tables, make([]tableLog, i+1-len(l.tables))...)
	}
	return &l.tables[i]
}

// markDirty puts slot s of table id in the dirty set and returns the log
// bytes it added: dirtyEntryBytes, or 0 if s was already in the set.
func (l *changeLog) markDirty(id partition.TableID, s partition.Slot) int {
	tl := l.table(id)
	w, bit := int(s>>6), uint64(1)<<(s&63)
	if w >= len(tl.member) {
		// Grow to at least twice the words, so a table whose slots grow
		// one by one reallocates its bitset O(log slots) times.
		n := max(w+1, 2*len(tl.member))
		tl.member = append(tl.member, make([]uint64, n-len(tl.member))...)
	}
	if tl.member[w]&bit != 0 {
		return 0
	}
	tl.member[w] |= bit
	tl.dirty = append(tl.dirty, s)
	l.bytes += dirtyEntryBytes
	return dirtyEntryBytes
}

// logDelete appends a copy of key, a deleted row's key tuple, to table
// id's deleted keys and returns the log bytes it added.
func (l *changeLog) logDelete(id partition.TableID, key []byte) int {
	tl := l.table(id)
	if uint64(len(tl.keys))+uint64(len(key)) > math.MaxUint32 {
		// Unreachable while the log keeps under ChangeLogBytesLimit; only a
		// single txn deleting gigabytes of keys behind the cursor gets here.
		panic(fmt.Sprintf("cow: table %d deleted keys pass 4 GiB in one log", id))
	}
	tl.keys = append(tl.keys, key...)
	tl.keyEnds = append(tl.keyEnds, uint32(len(tl.keys)))
	n := len(key) + keyEntryOverheadBytes
	l.bytes += n
	return n
}

// key returns deleted key i of tl.
func (tl *tableLog) key(i int) []byte {
	start := uint32(0)
	if i > 0 {
		start = tl.keyEnds[i-1]
	}
	return tl.keys[start:tl.keyEnds[i]]
}

// clearMember takes s out of the membership bitset (its dirty list entry
// is being cut into a block).
func (tl *tableLog) clearMember(s partition.Slot) {
	tl.member[s>>6] &^= uint64(1) << (s & 63)
}

// reset empties the log, keeping its buffers for the next round. Every
// bitset must already be clear (each dirty slot cut clears its bit), so
// this costs O(tables), not O(slots).
func (l *changeLog) reset() {
	if l.bytes != 0 {
		panic(fmt.Sprintf("cow: change log reset with %d bytes unshipped", l.bytes))
	}
	for i := range l.tables {
		tl := &l.tables[i]
		tl.dirty = tl.dirty[:0]
		tl.keys = tl.keys[:0]
		tl.keyEnds = tl.keyEnds[:0]
	}
}
