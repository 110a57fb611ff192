package partition

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/rejoin-db/rejoin/wire"
)

// Slot is the index of a row in its table. A row keeps its slot from insert
// to delete, whatever updates it sees (primary key changes included); a
// freed slot is reused, most recently freed first.
type Slot uint32

// Limits of a table.
const (
	// SlotsMax bounds the slots of one table, and so its live rows.
	SlotsMax = 1 << 31
	// slotPageLen is the number of slot entries in a full page of the slot
	// table: 8192 entries of 12 bytes, 96 KiB.
	slotPageBits = 13
	slotPageLen  = 1 << slotPageBits
	slotPageMask = slotPageLen - 1
	// slotPageLenMin is the first page's initial length.
	slotPageLenMin = 16
	// ReserveRowsMax bounds what Reserve sizes a table for: its index is
	// then at most 4 Mi buckets, 32 MiB. A larger table grows past it as
	// usual, one doubling per doubling of its rows.
	ReserveRowsMax = 1 << 21
)

// Errors of table writes and reads, classified with errors.Is. A write that
// returns an error has changed nothing.
var (
	// ErrSchema: a row or key does not match the table's schema (field
	// count, field types, malformed or non-canonical tuple, trailing bytes).
	ErrSchema = errors.New("partition: row does not match schema")
	// ErrDuplicateKey: another live row already has that primary key.
	ErrDuplicateKey = errors.New("partition: duplicate primary key")
	// ErrNoRow: the slot holds no live row.
	ErrNoRow = errors.New("partition: no row in slot")
	// ErrSlotNotFree: InsertTupleAt was given a slot that is live or was
	// never allocated.
	ErrSlotNotFree = errors.New("partition: slot is not free")
	// ErrTupleTooLarge: the tuple is longer than TupleBytesMax.
	ErrTupleTooLarge = errors.New("partition: tuple too large")
	// ErrTableFull: the table has SlotsMax live rows.
	ErrTableFull = errors.New("partition: table full")
)

// slotEntry is one slot of the slot table: 12 bytes, no pointers.
type slotEntry struct {
	// chunk and off locate the row's tuple in the arena; meaningful only
	// while the slot is live.
	chunk uint32
	// off is the tuple's offset in its chunk while the slot is live; while
	// it is free, off is the next slot of the free list plus one (0 ends
	// the list).
	off uint32
	// n is the tuple's length; 0 means the slot is free (a tuple is at
	// least 2 bytes).
	n uint32
}

// Table is one table of a partition: rows stored as canonical tuples in
// an arena, a slot table, a primary key index and a running digest. Like
// its partition, it is not safe for concurrent use.
type Table struct {
	p      *Partition
	id     TableID
	schema Schema // immutable after CreateTable

	types, keyTypes []wire.Type
	keyHdr          []byte // array header of every key tuple
	tupleHdrLen     int    // length of the array header of every row tuple
	keyPrefix       bool   // schema.keyIsPrefix()
	keyColMax       int    // the highest key column

	// pages is the slot table: slot s is pages[s>>slotPageBits][s&slotPageMask].
	// Invariant: every page but the last has slotPageLen entries, and the
	// entries of all pages number hwm.
	pages [][]slotEntry
	// hwm is the high-water mark of slots: every slot ever allocated since
	// the last Clear is < hwm; slots >= hwm do not exist.
	hwm Slot
	// freeHead is the most recently freed slot plus one, or 0. Invariant:
	// the free list reached from freeHead holds every free slot < hwm
	// exactly once, and no live one.
	freeHead uint32
	// live is the number of live slots. Invariant: live == index.count.
	live int

	arena arena
	index pkIndex
	// digest is the sum, mod 2^64, of RowHash(id, tuple) over the live rows.
	digest uint64

	// compacting is set while a compaction runs; sweep is its cursor.
	// Invariant: while compacting, no live slot < sweep points into an evac
	// chunk; when sweep reaches hwm the evac chunks are all released.
	compacting bool
	sweep      Slot

	// Scratch, reused by every call.
	enc        *wire.TupleEncoder
	offs       []int  // ScanTuple field offsets of the tuple being written
	storedOffs []int  // field offsets of a stored tuple, up to keyColMax
	rowBuf     []byte // the tuple encoded by Insert and Update
	keyBuf     []byte // the key of the tuple being written or looked up
	cmpBuf     []byte // the key of an index candidate
	oldBuf     []byte // the key of the row being replaced or deleted
	evKey      []byte // the key tuple handed to Observer.OnDelete
	// UpsertTuples' rows, and their keys when the key is not a prefix of
	// the columns: as long as the largest run applied, a block.
	batch     []batchRow
	batchKeys []byte
}

// upsertBatchRows is how many rows UpsertTuples touches in the index ahead
// of writing them: enough loads in flight to overlap their DRAM latency,
// few enough that the buckets are still in the cache when written.
const upsertBatchRows = 64

// batchRow is what UpsertTuples learns of one row while it checks the run,
// so that writing the row needs no second scan.
type batchRow struct {
	end int // where the row's tuple ends in the run
	// The key fields are run[keyAt:keyEnd] when the key is a prefix of the
	// columns, else batchKeys[keyAt:keyEnd] (behind the key's array
	// header, which AppendKey writes too).
	keyAt, keyEnd int
	h             uint32 // keyHash of the key fields
}

func newTable(p *Partition, id TableID, s Schema) *Table {
	s = s.clone()
	t := &Table{
		p:           p,
		id:          id,
		schema:      s,
		types:       s.Types(),
		keyHdr:      wire.AppendArrayHeader(nil, len(s.Key)),
		tupleHdrLen: len(wire.AppendArrayHeader(nil, len(s.Columns))),
		keyPrefix:   s.keyIsPrefix(),
		arena:       newArena(defaultArenaConfig),
		index:       newPKIndex(),
		enc:         wire.NewTupleEncoder(),
		offs:        make([]int, len(s.Columns)+1),
	}
	t.keyTypes = make([]wire.Type, len(s.Key))
	for i, k := range s.Key {
		t.keyTypes[i] = t.types[k]
		t.keyColMax = max(t.keyColMax, k)
	}
	t.storedOffs = make([]int, t.keyColMax+2)
	return t
}

// ID returns the table's ID.
func (t *Table) ID() TableID { return t.id }

// Schema returns the table's schema. Its slices are shared with the table:
// read them, never modify them.
func (t *Table) Schema() Schema { return t.schema }

// Len returns the number of live rows.
func (t *Table) Len() int { return t.live }

// Reserve sizes the table's primary key index for rows live rows, so that
// inserting up to that many rehashes it once, now, instead of at every
// doubling on the way there. A rejoin destination calls it with the
// source's row count before the snapshot arrives. It is a hint: rows is
// capped at ReserveRowsMax (a wrong or hostile count allocates at most
// that index), a count at or below the table's size does nothing, and the
// rows and digest stay as they are.
func (t *Table) Reserve(rows int) {
	rows = min(rows, ReserveRowsMax)
	if rows > t.live {
		t.index.reserve(rows - t.live)
	}
}

// SlotsLen returns the high-water mark of slots: every live slot is below
// it, so walking [0, SlotsLen()) visits every row. It only grows, except
// through Partition.Clear.
func (t *Table) SlotsLen() Slot { return t.hwm }

// Live reports whether slot s holds a row.
func (t *Table) Live(s Slot) bool { return s < t.hwm && t.ent(s).n != 0 }

func (t *Table) ent(s Slot) *slotEntry { return &t.pages[s>>slotPageBits][s&slotPageMask] }

func (t *Table) tupleAt(e *slotEntry) []byte { return t.arena.bytes(e.chunk, e.off, e.n) }

// Tuple returns the stored tuple of slot s, or nil if s is not live. The
// bytes alias the table's memory: they are valid until the next write to
// the table, and must not be modified.
func (t *Table) Tuple(s Slot) []byte {
	if !t.Live(s) {
		return nil
	}
	return t.tupleAt(t.ent(s))
}

// Row decodes the row in slot s into dst (reusing its capacity). Bytes
// values alias the table's memory, valid until the next write to the table.
func (t *Table) Row(s Slot, dst []wire.Value) ([]wire.Value, error) {
	if !t.Live(s) {
		return dst, fmt.Errorf("%w: table %q slot %d", ErrNoRow, t.schema.Name, s)
	}
	vals, _, err := wire.DecodeTuple(t.tupleAt(t.ent(s)), t.types, dst)
	if err != nil {
		panic(fmt.Sprintf("partition: table %q slot %d holds an undecodable tuple: %v", t.schema.Name, s, err))
	}
	return vals, nil
}

// Lookup returns the slot of the live row whose primary key is key, a
// canonical key tuple. A key that is not a valid key tuple of the table is
// not found.
func (t *Table) Lookup(key []byte) (Slot, bool) {
	fields, err := t.checkKey(key)
	if err != nil {
		return 0, false
	}
	return t.index.lookup(keyHash(fields), fields, t)
}

// LookupValues is Lookup with the key given as the values of the key
// columns, in key order.
func (t *Table) LookupValues(key []wire.Value) (Slot, bool) {
	if len(key) != len(t.keyTypes) {
		return 0, false
	}
	for i, v := range key {
		if v.Type != t.keyTypes[i] {
			return 0, false
		}
	}
	b, err := t.enc.AppendTuple(t.keyBuf[:0], key)
	if err != nil {
		return 0, false
	}
	t.keyBuf = b
	fields := b[len(t.keyHdr):]
	return t.index.lookup(keyHash(fields), fields, t)
}

// Insert adds a row and returns its slot.
func (t *Table) Insert(row []wire.Value) (Slot, error) {
	tuple, err := t.encodeRow(row)
	if err != nil {
		return 0, err
	}
	return t.insert(tuple, 0, false)
}

// InsertTuple adds a row given as its canonical tuple, which must be exactly
// one tuple of the table's column types.
func (t *Table) InsertTuple(tuple []byte) (Slot, error) {
	if err := t.scanTuple(tuple); err != nil {
		return 0, err
	}
	return t.insert(tuple, 0, false)
}

// InsertTupleAt adds a row in the free slot s. It exists to undo a delete:
// a rolled-back transaction puts the row back where it was, so slots are as
// if the delete never happened. The slot most recently freed costs O(1);
// any other free slot is found by walking the free list.
func (t *Table) InsertTupleAt(s Slot, tuple []byte) error {
	if s >= t.hwm || t.ent(s).n != 0 {
		return fmt.Errorf("%w: table %q slot %d (slots %d)", ErrSlotNotFree, t.schema.Name, s, t.hwm)
	}
	if err := t.scanTuple(tuple); err != nil {
		return err
	}
	_, err := t.insert(tuple, s, true)
	return err
}

// Update replaces the row in slot s. The new row may have another primary
// key, as long as no other live row has it; the slot stays the same.
func (t *Table) Update(s Slot, row []wire.Value) error {
	if !t.Live(s) {
		return fmt.Errorf("%w: table %q slot %d", ErrNoRow, t.schema.Name, s)
	}
	tuple, err := t.encodeRow(row)
	if err != nil {
		return err
	}
	return t.update(s, tuple, t.scannedKeyFields(tuple))
}

// UpdateTuple is Update with the row given as its canonical tuple.
func (t *Table) UpdateTuple(s Slot, tuple []byte) error {
	if !t.Live(s) {
		return fmt.Errorf("%w: table %q slot %d", ErrNoRow, t.schema.Name, s)
	}
	if err := t.scanTuple(tuple); err != nil {
		return err
	}
	return t.update(s, tuple, t.scannedKeyFields(tuple))
}

// Upsert writes tuple by its primary key: it updates the live row with
// that key, or inserts a new row. It returns the row's slot.
func (t *Table) Upsert(tuple []byte) (Slot, error) {
	if err := t.scanTuple(tuple); err != nil {
		return 0, err
	}
	fields := t.scannedKeyFields(tuple)
	h := keyHash(fields)
	if s, ok := t.index.lookup(h, fields, t); ok {
		return s, t.update(s, tuple, fields)
	}
	return t.insertAbsent(tuple, h, 0, false)
}

// UpsertTuples writes count rows by their primary keys, as Upsert would one
// after the other. run holds their canonical tuples back to back, with
// nothing before, between or after them. It checks the whole run before
// writing anything: a run that is not exactly count tuples of the table,
// holds a tuple longer than TupleBytesMax, or may not fit (the table's
// rows plus count above SlotsMax) is an error wrapping ErrSchema,
// ErrTupleTooLarge or ErrTableFull, and changes nothing.
//
// It is the rejoin's apply path: it scans each tuple once, and looks up
// the keys a batch at a time (see pkIndex.touch).
func (t *Table) UpsertTuples(run []byte, count int) error {
	if err := t.scanRun(run, count); err != nil {
		return err
	}
	// Checked: no write below can fail, short of a bug.
	start := 0
	for i := 0; i < len(t.batch); i += upsertBatchRows {
		rows := t.batch[i:min(i+upsertBatchRows, len(t.batch))]
		t.index.reserve(len(rows))
		t.index.touch(rows)
		for _, r := range rows {
			tuple := run[start:r.end:r.end]
			start = r.end
			fields := run[r.keyAt:r.keyEnd]
			if !t.keyPrefix {
				fields = t.batchKeys[r.keyAt:r.keyEnd]
			}
			var err error
			if s, ok := t.index.lookup(r.h, fields, t); ok {
				err = t.update(s, tuple, fields)
			} else {
				_, err = t.insertAbsent(tuple, r.h, 0, false)
			}
			if err != nil {
				panic(fmt.Sprintf("partition: table %q: checked upsert failed: %v", t.schema.Name, err))
			}
		}
	}
	return nil
}

// scanRun checks run for UpsertTuples and leaves each row's end, key and
// key hash in t.batch.
func (t *Table) scanRun(run []byte, count int) error {
	if count < 0 || t.live+count > SlotsMax {
		return fmt.Errorf("%w: table %q with %d rows cannot take %d more", ErrTableFull, t.schema.Name, t.live, count)
	}
	t.batch = t.batch[:0]
	t.batchKeys = t.batchKeys[:0]
	pos := 0
	for i := range count {
		n, err := wire.ScanTuple(run[pos:], t.types, t.offs)
		if err != nil {
			return fmt.Errorf("%w: table %q: tuple %d at byte %d: %w", ErrSchema, t.schema.Name, i, pos, err)
		}
		if n > TupleBytesMax {
			return fmt.Errorf("%w: table %q: tuple %d of %d bytes, limit %d", ErrTupleTooLarge, t.schema.Name, i, n, TupleBytesMax)
		}
		r := batchRow{end: pos + n}
		var fields []byte
		if t.keyPrefix {
			r.keyAt, r.keyEnd = pos+t.offs[0], pos+t.offs[len(t.schema.Key)]
			fields = run[r.keyAt:r.keyEnd]
		} else {
			r.keyAt = len(t.batchKeys) + len(t.keyHdr)
			t.batchKeys = wire.AppendKey(t.batchKeys, run[pos:r.end], t.offs, t.schema.Key)
			r.keyEnd = len(t.batchKeys)
			fields = t.batchKeys[r.keyAt:r.keyEnd]
		}
		r.h = keyHash(fields)
		t.batch = append(t.batch, r)
		pos = r.end
	}
	if pos != len(run) {
		return fmt.Errorf("%w: table %q: %d bytes after %d tuples", ErrSchema, t.schema.Name, len(run)-pos, count)
	}
	return nil
}

// Delete removes the row in slot s and frees the slot.
func (t *Table) Delete(s Slot) error {
	if !t.Live(s) {
		return fmt.Errorf("%w: table %q slot %d", ErrNoRow, t.schema.Name, s)
	}
	e := t.ent(s)
	old := t.tupleAt(e)
	fields := t.storedKeyFields(old, &t.oldBuf)
	h := keyHash(fields)
	obs := t.p.observer
	if obs != nil {
		t.evKey = append(append(t.evKey[:0], t.keyHdr...), fields...)
	}
	t.digest -= RowHash(t.id, old)
	t.index.remove(h, s)
	t.arena.free(e.chunk, int(e.n))
	*e = slotEntry{off: t.freeHead}
	t.freeHead = uint32(s) + 1
	t.live--
	t.maybeCompact()
	if obs != nil {
		obs.OnDelete(t.id, s, t.evKey)
	}
	return nil
}

// DeleteKey removes the live row whose primary key is key, a canonical key
// tuple, and reports whether there was one.
func (t *Table) DeleteKey(key []byte) (bool, error) {
	fields, err := t.checkKey(key)
	if err != nil {
		return false, err
	}
	s, ok := t.index.lookup(keyHash(fields), fields, t)
	if !ok {
		return false, nil
	}
	return true, t.Delete(s)
}

// AppendTuples appends to dst the stored tuples of the live slots from
// `from` upward, back to back with no array header, stopping before the
// bytes appended would exceed maxBytes, but always appending at least one
// tuple if one remains. It returns the slot to continue at, which is
// max(from, SlotsLen()) once the walk has reached the end, and the number
// of tuples appended. This is the table stream cursor's primitive.
func (t *Table) AppendTuples(dst []byte, from Slot, maxBytes int) (out []byte, next Slot, count int) {
	added := 0
	s := from
	for ; s < t.hwm; s++ {
		e := t.ent(s)
		if e.n == 0 {
			continue
		}
		if count > 0 && added+int(e.n) > maxBytes {
			break
		}
		dst = append(dst, t.tupleAt(e)...)
		added += int(e.n)
		count++
	}
	return dst, s, count
}

// encodeRow checks row against the schema and encodes it into t.rowBuf,
// leaving its field offsets in t.offs.
func (t *Table) encodeRow(row []wire.Value) ([]byte, error) {
	if len(row) != len(t.types) {
		return nil, fmt.Errorf("%w: table %q has %d columns, row has %d values", ErrSchema, t.schema.Name, len(t.types), len(row))
	}
	for i, v := range row {
		if v.Type != t.types[i] {
			return nil, fmt.Errorf("%w: table %q column %q is %v, value is %v", ErrSchema, t.schema.Name, t.schema.Columns[i].Name, t.types[i], v.Type)
		}
	}
	b, err := t.enc.AppendTuple(t.rowBuf[:0], row)
	if err != nil {
		return nil, fmt.Errorf("%w: table %q: %w", ErrSchema, t.schema.Name, err)
	}
	t.rowBuf = b
	if err := t.scanTuple(b); err != nil {
		return nil, err
	}
	return b, nil
}

// scanTuple checks that tuple is exactly one canonical tuple of the
// table's types and leaves its field offsets in t.offs.
func (t *Table) scanTuple(tuple []byte) error {
	if len(tuple) > TupleBytesMax {
		return fmt.Errorf("%w: table %q tuple of %d bytes, limit %d", ErrTupleTooLarge, t.schema.Name, len(tuple), TupleBytesMax)
	}
	n, err := wire.ScanTuple(tuple, t.types, t.offs)
	if err != nil {
		return fmt.Errorf("%w: table %q: %w", ErrSchema, t.schema.Name, err)
	}
	if n != len(tuple) {
		return fmt.Errorf("%w: table %q: %d bytes after the tuple", ErrSchema, t.schema.Name, len(tuple)-n)
	}
	return nil
}

// insert adds tuple, scanned into t.offs, in a new slot, or in the free
// slot at if useAt.
func (t *Table) insert(tuple []byte, at Slot, useAt bool) (Slot, error) {
	fields := t.scannedKeyFields(tuple)
	h := keyHash(fields)
	if _, dup := t.index.lookup(h, fields, t); dup {
		return 0, t.errDuplicate(fields)
	}
	return t.insertAbsent(tuple, h, at, useAt)
}

// insertAbsent inserts a scanned tuple whose key, hashing to h, the caller
// has just looked up and not found; Upsert and UpsertTuples, the rejoin's
// apply path, save the second lookup this way.
func (t *Table) insertAbsent(tuple []byte, h uint32, at Slot, useAt bool) (Slot, error) {
	var s Slot
	switch {
	case useAt:
		s = at
		t.unlinkFree(s)
	case t.freeHead != 0:
		s = Slot(t.freeHead - 1)
		t.freeHead = t.ent(s).off
	case t.hwm >= SlotsMax:
		return 0, fmt.Errorf("%w: table %q has %d rows", ErrTableFull, t.schema.Name, t.live)
	default:
		s = t.newSlot()
	}
	c, off, dst := t.arena.alloc(len(tuple))
	copy(dst, tuple)
	*t.ent(s) = slotEntry{chunk: c, off: off, n: uint32(len(tuple))}
	t.index.insert(h, s)
	t.live++
	t.digest += RowHash(t.id, tuple)
	t.maybeCompact()
	if obs := t.p.observer; obs != nil {
		obs.OnInsert(t.id, s)
	}
	return s, nil
}

// update replaces the live row in slot s by tuple, whose key fields are
// newFields.
func (t *Table) update(s Slot, tuple, newFields []byte) error {
	e := t.ent(s)
	old := t.tupleAt(e)
	oldFields := t.storedKeyFields(old, &t.oldBuf)
	obs := t.p.observer
	keyChanged := !bytes.Equal(oldFields, newFields)
	var oldH, newH uint32
	if keyChanged {
		newH = keyHash(newFields)
		if _, dup := t.index.lookup(newH, newFields, t); dup {
			return t.errDuplicate(newFields)
		}
		oldH = keyHash(oldFields)
		if obs != nil {
			t.evKey = append(append(t.evKey[:0], t.keyHdr...), oldFields...)
		}
	}
	// Nothing can fail from here on.
	t.digest += RowHash(t.id, tuple) - RowHash(t.id, old)
	if n := len(tuple); n <= int(e.n) {
		// Same size or smaller: overwrite in place; the tail becomes dead.
		copy(old, tuple)
		t.arena.free(e.chunk, int(e.n)-n)
		e.n = uint32(n)
	} else {
		c, off, dst := t.arena.alloc(n)
		copy(dst, tuple)
		t.arena.free(e.chunk, int(e.n))
		*e = slotEntry{chunk: c, off: off, n: uint32(n)}
	}
	if keyChanged {
		t.index.remove(oldH, s)
		t.index.insert(newH, s)
	}
	t.maybeCompact()
	if obs != nil {
		if keyChanged {
			obs.OnDelete(t.id, s, t.evKey)
			obs.OnInsert(t.id, s)
		} else {
			obs.OnUpdate(t.id, s)
		}
	}
	return nil
}

func (t *Table) errDuplicate(fields []byte) error {
	key := append(append([]byte(nil), t.keyHdr...), fields...)
	vals, _, err := wire.DecodeTuple(key, t.keyTypes, nil)
	if err != nil {
		return fmt.Errorf("%w: table %q key %x", ErrDuplicateKey, t.schema.Name, key)
	}
	return fmt.Errorf("%w: table %q key %v", ErrDuplicateKey, t.schema.Name, vals)
}

// newSlot appends a free entry to the slot table and returns its slot.
func (t *Table) newSlot() Slot {
	s := t.hwm
	p := int(s >> slotPageBits)
	if p == len(t.pages) {
		n := slotPageLen
		if p == 0 {
			n = slotPageLenMin
		}
		t.pages = append(t.pages, make([]slotEntry, 0, n))
	}
	pg := t.pages[p]
	if len(pg) == cap(pg) {
		// Only the first page grows; its growth stops at slotPageLen.
		grown := make([]slotEntry, len(pg), min(2*cap(pg), slotPageLen))
		copy(grown, pg)
		pg = grown
	}
	t.pages[p] = append(pg, slotEntry{})
	t.hwm++
	return s
}

// unlinkFree takes the free slot s off the free list.
func (t *Table) unlinkFree(s Slot) {
	next := t.ent(s).off
	if t.freeHead == uint32(s)+1 {
		t.freeHead = next
		return
	}
	for f := t.freeHead; f != 0; {
		e := t.ent(Slot(f - 1))
		if e.off == uint32(s)+1 {
			e.off = next
			return
		}
		f = e.off
	}
	panic(fmt.Sprintf("partition: table %q free slot %d is not on the free list", t.schema.Name, s))
}

// maybeCompact starts a compaction when the sealed chunks are more than a
// quarter dead, and advances a running one by a bounded step: it moves the
// live tuples of evac chunks found at the cursor into the open chunk. Every
// write calls it once, after its change, so the cost is spread over writes
// and a compaction finishes within SlotsLen()/stepSlots writes.
func (t *Table) maybeCompact() {
	a := &t.arena
	if !t.compacting {
		if !a.shouldCompact() || a.markEvacuation() == 0 {
			return
		}
		t.compacting, t.sweep = true, 0
	}
	examined, moved := 0, 0
	for t.sweep < t.hwm && examined < a.cfg.stepSlots && moved < a.cfg.stepBytes {
		e := t.ent(t.sweep)
		if e.n != 0 && a.chunks[e.chunk].evac {
			c, off, dst := a.alloc(int(e.n))
			copy(dst, a.bytes(e.chunk, e.off, e.n))
			a.free(e.chunk, int(e.n))
			e.chunk, e.off = c, off
			moved += int(e.n)
		}
		t.sweep++
		examined++
	}
	if t.sweep >= t.hwm {
		if a.evacChunks != 0 {
			panic(fmt.Sprintf("partition: table %q compaction swept every slot but %d chunks are still evacuating", t.schema.Name, a.evacChunks))
		}
		t.compacting = false
	}
}

// clear drops every row; the schema and ID stay.
func (t *Table) clear() {
	t.pages = nil
	t.hwm = 0
	t.freeHead = 0
	t.live = 0
	t.arena = newArena(t.arena.cfg)
	t.index = newPKIndex()
	t.digest = 0
	t.compacting, t.sweep = false, 0
}

// verify checks every invariant of the table from scratch, in O(rows +
// chunks + buckets) time and with allocations. Tests call it after each
// step; it is too slow for production writes.
func (t *Table) verify() error {
	a := &t.arena
	// The slot table and its free list.
	entries := 0
	for i, pg := range t.pages {
		if i < len(t.pages)-1 && len(pg) != slotPageLen {
			return fmt.Errorf("page %d of %d has %d entries", i, len(t.pages), len(pg))
		}
		entries += len(pg)
	}
	if entries != int(t.hwm) {
		return fmt.Errorf("slot table has %d entries, hwm %d", entries, t.hwm)
	}
	onFree := make([]bool, t.hwm)
	free := 0
	for f := t.freeHead; f != 0; f = t.ent(Slot(f - 1)).off {
		s := Slot(f - 1)
		switch {
		case s >= t.hwm:
			return fmt.Errorf("free list holds slot %d >= hwm %d", s, t.hwm)
		case onFree[s]:
			return fmt.Errorf("free list holds slot %d twice", s)
		case t.ent(s).n != 0:
			return fmt.Errorf("free list holds live slot %d", s)
		}
		onFree[s] = true
		free++
	}
	// Live slots: tuples, chunk accounting, digest, index.
	type span struct{ off, end uint32 }
	spans := make([][]span, len(a.chunks))
	chunkLive := make([]int, len(a.chunks))
	var digest uint64
	live := 0
	for s := Slot(0); s < t.hwm; s++ {
		e := t.ent(s)
		if e.n == 0 {
			if !onFree[s] {
				return fmt.Errorf("free slot %d is not on the free list", s)
			}
			continue
		}
		live++
		if int(e.chunk) >= len(a.chunks) || a.chunks[e.chunk].buf == nil || int(e.off)+int(e.n) > len(a.chunks[e.chunk].buf) {
			return fmt.Errorf("slot %d points to chunk %d [%d,+%d), outside the arena", s, e.chunk, e.off, e.n)
		}
		if e.chunk == a.open && int(e.off+e.n) > a.openUsed {
			return fmt.Errorf("slot %d lies past the used part of the open chunk", s)
		}
		if t.compacting && s < t.sweep && a.chunks[e.chunk].evac {
			return fmt.Errorf("slot %d is behind the compaction cursor %d but in evac chunk %d", s, t.sweep, e.chunk)
		}
		spans[e.chunk] = append(spans[e.chunk], span{e.off, e.off + e.n})
		chunkLive[e.chunk] += int(e.n)
		tuple := t.tupleAt(e)
		if n, err := wire.ScanTuple(tuple, t.types, nil); err != nil || n != len(tuple) {
			return fmt.Errorf("slot %d holds a bad tuple (%d of %d bytes): %v", s, n, len(tuple), err)
		}
		digest += RowHash(t.id, tuple)
		fields := t.storedKeyFields(tuple, &t.oldBuf)
		if got, ok := t.index.lookup(keyHash(fields), fields, t); !ok || got != s {
			return fmt.Errorf("slot %d: its key finds slot %d, %v", s, got, ok)
		}
	}
	if live != t.live || live != t.index.count || free != int(t.hwm)-live {
		return fmt.Errorf("live %d, Len %d, index %d, free %d of %d slots", live, t.live, t.index.count, free, t.hwm)
	}
	if digest != t.digest {
		return fmt.Errorf("digest %016x, recomputed %016x", t.digest, digest)
	}
	for _, e := range t.index.buckets {
		if e != 0 && !t.Live(bucketSlot(e)) {
			return fmt.Errorf("index holds free slot %d", bucketSlot(e))
		}
	}
	if err := t.index.verify(); err != nil {
		return err
	}
	// Chunks.
	released := make(map[uint32]bool, len(a.released))
	for _, c := range a.released {
		released[c] = true
	}
	capBytes, liveBytes, evac := 0, 0, 0
	for c := range a.chunks {
		ch := &a.chunks[c]
		if ch.buf == nil {
			if !released[uint32(c)] || ch.live != 0 || ch.evac || uint32(c) == a.open {
				return fmt.Errorf("chunk %d has no memory but is not a clean released chunk", c)
			}
			continue
		}
		if released[uint32(c)] {
			return fmt.Errorf("chunk %d is on the released list but has memory", c)
		}
		if ch.live != chunkLive[c] {
			return fmt.Errorf("chunk %d counts %d live bytes, slots hold %d", c, ch.live, chunkLive[c])
		}
		if ch.live == 0 && uint32(c) != a.open {
			return fmt.Errorf("sealed chunk %d is empty but not released", c)
		}
		if ch.evac {
			if uint32(c) == a.open || !t.compacting {
				return fmt.Errorf("chunk %d is evac outside a compaction or open", c)
			}
			evac++
		}
		sp := spans[c]
		slices.SortFunc(sp, func(x, y span) int { return cmp.Compare(x.off, y.off) })
		for i := 1; i < len(sp); i++ {
			if sp[i].off < sp[i-1].end {
				return fmt.Errorf("chunk %d: tuples at %d and %d overlap", c, sp[i-1].off, sp[i].off)
			}
		}
		capBytes += len(ch.buf)
		liveBytes += ch.live
	}
	if capBytes != a.capBytes || liveBytes != a.liveBytes || evac != a.evacChunks {
		return fmt.Errorf("arena counts cap %d live %d evac %d, chunks hold %d, %d, %d", a.capBytes, a.liveBytes, a.evacChunks, capBytes, liveBytes, evac)
	}
	if len(released) != len(a.released) {
		return fmt.Errorf("released list repeats a chunk")
	}
	return nil
}
