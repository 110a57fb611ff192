package cow

import (
	"fmt"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

// Block is one block of the table stream: tuples of one table, all of one
// kind. The recovery source wraps it in a wire.Block, adding the epoch,
// partition and sequence number.
type Block struct {
	Kind wire.BlockKind
	// Table is the table the tuples belong to.
	Table partition.TableID
	// Count is the number of tuples.
	Count uint32
	// Tuples is the block's payload as wire.Block carries it: the
	// canonical array header for Count elements, then Count tuples (whole
	// rows for snapshot and upsert blocks, key tuples for delete blocks).
	Tuples []byte
}

// Counts measures blocks of one kind.
type Counts struct {
	Blocks int64
	Rows   int64
	// Bytes counts tuple bytes, array headers excluded.
	Bytes int64
}

// Add counts one block of rows tuples and bytes tuple bytes; the recovery
// processors count what they send and apply with it too.
func (c *Counts) Add(rows, bytes int) {
	c.Blocks++
	c.Rows += int64(rows)
	c.Bytes += int64(bytes)
}

// Metrics is what a stream did. It is a plain value: Stream.Metrics
// returns a copy.
type Metrics struct {
	// Snapshot counts the snapshot's blocks; Deletes and Upserts the catch-up
	// rounds' blocks, the final delta's included; Final the final delta's
	// blocks alone.
	Snapshot, Deletes, Upserts, Final Counts
	// Rounds counts catch-up rounds started, the final delta included.
	Rounds int
	// DeletesDropped counts logged deletes not shipped because their key was
	// live again when the block was cut (DESIGN.md step 6).
	DeletesDropped int64
	// UpsertsGone counts dirty slots not shipped because they held no row
	// when the block was cut (their delete is in the log).
	UpsertsGone int64
	// Changes counts the observer calls the stream received.
	Changes int64
	// LogBytesPeak is the largest LogBytes ever reached.
	LogBytesPeak int
	// TxnBytesPeak is the most log bytes one txn added, and TxnsOverReserve
	// the txns that added more than ChangeLogTxnBytesMax (only those can
	// take the log past ChangeLogBytesMax).
	TxnBytesPeak    int
	TxnsOverReserve int64
	// TxnsHeld and TxnsPaced count the times the gate refused a txn
	// because the log was above the hold mark, or because the tick's pace
	// was used up. A txn asked about again counts again.
	TxnsHeld, TxnsPaced int64
	// TxnsHeldForRound counts the refusals because the round in flight's
	// budget was used up (see RoundBudgetSpent).
	TxnsHeldForRound int64
	// TxnsHeldForHandoff counts the refusals from FinalDelta on.
	TxnsHeldForHandoff int64
	// Ticks counts Tick calls; ThrottledTicks those after which the gate
	// was pacing, holding, or holding for the round's budget; PaceStarts
	// how many times pacing began.
	Ticks, ThrottledTicks, PaceStarts int64
}

// Stream is the source side of one partition's table stream: the
// snapshot cursor, the change log and the catch-up rounds, and the gate
// that throttles execution. See the package doc for the protocol.
//
// A Stream is not safe for concurrent use: like its partition, it belongs
// to the executor goroutine, and every call is made between two txns.
type Stream struct {
	p     *partition.Partition
	cfg   Config
	phase Phase

	// The snapshot cursor: tables before snapTable (an index, TableID-1)
	// are finished, the table at snapTable is walked up to snapPos, and
	// the rest are not started. A slot is behind the cursor (see behind)
	// exactly when the snapshot has read it or will never read it.
	// snapDone is set when the walk has finished every table, from which
	// moment every slot, of every table, is behind.
	snapTable int
	snapPos   partition.Slot
	snapDone  bool

	// cur is the log being filled. round is the log the round in flight is
	// shipping; outside a round it is empty. rKind, rTable and rNext are the
	// round's position: the kind of blocks being cut (deletes, then
	// upserts), the table index, and the next entry of that table's list.
	cur, round    *changeLog
	rKind         wire.BlockKind
	rTable, rNext int

	th throttle
	m  Metrics
}

// Activate starts a table stream on p at a txn boundary S: the caller
// guarantees that every txn < S has executed and none >= S has. It
// installs the stream as p's observer (replacing any other: a partition
// streams to one destination at a time), so every change from now on is
// heard. The caller installs the stream as the executor's gate (or asks
// it from its own gate) and calls Deactivate when the rejoin ends, however
// it ends.
func Activate(p *partition.Partition, cfg Config) (*Stream, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: nil partition", ErrConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Stream{
		p:     p,
		cfg:   cfg,
		phase: PhaseSnapshot,
		cur:   &changeLog{},
		round: &changeLog{},
		th:    newThrottle(cfg),
	}
	p.SetObserver((*observer)(s))
	return s, nil
}

// Deactivate ends the stream, on success and on every abort: it removes
// the observer and frees the log. The stream never writes to the
// partition, so the partition is then exactly as it would be without it.
// The gate lets everything through from now on. Calling it again does
// nothing. It clears p's observer whoever installed it (the partition
// offers no way to ask), so a stream on p must be deactivated before
// another is activated there.
func (s *Stream) Deactivate() {
	if s.phase == PhaseInactive {
		return
	}
	s.closeTxn()
	s.p.SetObserver(nil)
	s.cur, s.round = nil, nil
	s.th.addedRing, s.th.drainedRing = nil, nil
	s.th.pacing = false
	s.setPhase(PhaseInactive)
}

// Phase returns the stream's phase.
func (s *Stream) Phase() Phase { return s.phase }

// Config returns the stream's limits.
func (s *Stream) Config() Config { return s.cfg }

// LogBytes returns the change log's size as ChangeLogBytesMax bounds it
// (see changeLog.bytes): the log being filled plus what the round in
// flight has not cut yet. It is 0 once the stream is inactive.
func (s *Stream) LogBytes() int {
	if s.phase == PhaseInactive {
		return 0
	}
	return s.cur.bytes + s.round.bytes
}

// Metrics returns what the stream did so far.
func (s *Stream) Metrics() Metrics {
	s.closeTxn()
	return s.m
}

// StartRound starts a catch-up round: the log filled so far becomes the
// round's, and new changes go into a fresh log. NextBlock then returns the
// round's delete blocks, then its upsert blocks, and returns false when
// the round is shipped, moving the stream back between rounds. Allowed
// only between rounds (after the snapshot, with no round in flight).
func (s *Stream) StartRound() error {
	return s.startRound(PhaseRound)
}

// FinalDelta starts the last round, the handoff's delta (DESIGN.md step
// 7). The caller holds the executor at the handoff txn E: every txn < E
// executed, none >= E, and nothing else writes to the partition until
// Deactivate. From here on the gate holds every txn, and a change to the
// partition is a bug that panics (the delta would no longer be the
// difference to E). NextBlock returns the delta's blocks; when it returns
// false the stream is Done and the destination, having applied every
// block, holds exactly the partition's content, whose Digest goes with
// the handoff. Allowed only between rounds.
func (s *Stream) FinalDelta() error {
	return s.startRound(PhaseFinal)
}

func (s *Stream) startRound(ph Phase) error {
	s.closeTxn()
	if s.phase != PhaseBetweenRounds {
		return fmt.Errorf("%w: cannot start a %v round in phase %v", ErrPhase, ph, s.phase)
	}
	// round is empty between rounds (endRound reset it), so after the
	// swap cur is a fresh log that keeps the old one's buffers.
	s.cur, s.round = s.round, s.cur
	s.th.roundStartBytes = s.round.bytes
	s.rKind, s.rTable, s.rNext = wire.BlockDeletes, 0, 0
	s.m.Rounds++
	s.setPhase(ph)
	return nil
}

// NextBlock cuts the next block of the current phase, appending its
// Tuples to dst (pass a reused buffer's [:0]), and returns it. It returns
// false when the phase has no more blocks, and the phase has then moved
// on: the snapshot and each round to between rounds, the final delta to
// done. Between rounds, and when done or inactive, it returns false.
//
// Rows are read when the block is cut: a snapshot block holds the rows
// the cursor passes now, an upsert block the current row of each dirty
// slot, so a later change is always behind the cursor and logged.
func (s *Stream) NextBlock(dst []byte) (Block, bool) {
	s.closeTxn()
	switch s.phase {
	case PhaseSnapshot:
		if b, ok := s.nextSnapshotBlock(dst); ok {
			return b, true
		}
		s.snapDone = true
		s.setPhase(PhaseBetweenRounds)
	case PhaseRound, PhaseFinal:
		if b, ok := s.nextRoundBlock(dst); ok {
			return b, true
		}
		s.endRound()
	}
	return Block{}, false
}

// blockHeadGapBytes is the room a block's tuples are appended behind,
// before their count is known: the size of the array16 header that a
// block of 16 to 65535 tuples takes. Other counts move the tuples once.
const blockHeadGapBytes = 3

// finishBlock writes the array header for count tuples into the gap at
// buf[start:start+blockHeadGapBytes] and returns the block's Tuples.
func finishBlock(buf []byte, start, count int) []byte {
	var scratch [5]byte
	hdr := wire.AppendArrayHeader(scratch[:0], count)
	switch d := len(hdr) - blockHeadGapBytes; {
	case d < 0:
		copy(buf[start+len(hdr):], buf[start+blockHeadGapBytes:])
		buf = buf[:len(buf)+d]
	case d > 0:
		n := len(buf)
		buf = append(buf, scratch[:d]...)
		copy(buf[start+len(hdr):], buf[start+blockHeadGapBytes:n])
	}
	copy(buf[start:], hdr)
	return buf[start:]
}

// nextSnapshotBlock cuts the next block at the cursor, moving on to the
// next table when one is finished.
func (s *Stream) nextSnapshotBlock(dst []byte) (Block, bool) {
	start := len(dst)
	for {
		id := partition.TableID(s.snapTable + 1)
		t := s.p.Table(id)
		if t == nil {
			return Block{}, false
		}
		buf := append(dst, make([]byte, blockHeadGapBytes)...)
		buf, next, count := t.AppendTuples(buf, s.snapPos, s.cfg.BlockBytesMax)
		if count == 0 {
			// Finished: from now on every slot of the table is behind,
			// those beyond today's SlotsLen included.
			s.snapTable++
			s.snapPos = 0
			continue
		}
		s.snapPos = next
		tupleBytes := len(buf) - start - blockHeadGapBytes
		s.m.Snapshot.Add(count, tupleBytes)
		return Block{Kind: wire.BlockSnapshot, Table: id, Count: uint32(count), Tuples: finishBlock(buf, start, count)}, true
	}
}

// nextRoundBlock cuts the round's next block: delete blocks table by
// table, then upsert blocks table by table.
func (s *Stream) nextRoundBlock(dst []byte) (Block, bool) {
	if s.rKind == wire.BlockDeletes {
		if b, ok := s.nextDeleteBlock(dst); ok {
			return b, true
		}
		s.rKind, s.rTable, s.rNext = wire.BlockUpserts, 0, 0
	}
	return s.nextUpsertBlock(dst)
}

// nextDeleteBlock cuts the next block of the round's deleted keys. A key
// live again in the table is dropped here, not shipped: that live row
// reached or will reach the destination through the snapshot or a dirty
// slot, and the row arrives after its old key's delete was logged, so
// shipping the delete after it would remove the row (DESIGN.md step 6).
// Lookup is asked when the block is cut, not when the delete was logged,
// because the row may come back at any time until then.
func (s *Stream) nextDeleteBlock(dst []byte) (Block, bool) {
	start := len(dst)
	for ; s.rTable < len(s.round.tables); s.rTable, s.rNext = s.rTable+1, 0 {
		tl := &s.round.tables[s.rTable]
		id := partition.TableID(s.rTable + 1)
		t := s.p.Table(id)
		buf := append(dst, make([]byte, blockHeadGapBytes)...)
		count, tupleBytes := 0, 0
		for s.rNext < len(tl.keyEnds) {
			key := tl.key(s.rNext)
			if count > 0 && tupleBytes+len(key) > s.cfg.BlockBytesMax {
				break
			}
			s.rNext++
			s.round.bytes -= len(key) + keyEntryOverheadBytes
			s.drained(len(key) + keyEntryOverheadBytes)
			if _, live := t.Lookup(key); live {
				s.m.DeletesDropped++
				continue
			}
			buf = append(buf, key...)
			count++
			tupleBytes += len(key)
		}
		if count == 0 {
			continue // every remaining key of the table was dropped
		}
		s.m.Deletes.Add(count, tupleBytes)
		if s.phase == PhaseFinal {
			s.m.Final.Add(count, tupleBytes)
		}
		return Block{Kind: wire.BlockDeletes, Table: id, Count: uint32(count), Tuples: finishBlock(buf, start, count)}, true
	}
	return Block{}, false
}

// nextUpsertBlock cuts the next block of the round's dirty slots, each
// with its current row; a slot that holds no row now is skipped (the
// row's delete is logged, in this round or the next).
func (s *Stream) nextUpsertBlock(dst []byte) (Block, bool) {
	start := len(dst)
	for ; s.rTable < len(s.round.tables); s.rTable, s.rNext = s.rTable+1, 0 {
		tl := &s.round.tables[s.rTable]
		id := partition.TableID(s.rTable + 1)
		t := s.p.Table(id)
		buf := append(dst, make([]byte, blockHeadGapBytes)...)
		count, tupleBytes := 0, 0
		for s.rNext < len(tl.dirty) {
			slot := tl.dirty[s.rNext]
			tuple := t.Tuple(slot)
			if count > 0 && tupleBytes+len(tuple) > s.cfg.BlockBytesMax {
				break
			}
			s.rNext++
			tl.clearMember(slot)
			s.round.bytes -= dirtyEntryBytes
			s.drained(dirtyEntryBytes)
			if tuple == nil {
				s.m.UpsertsGone++
				continue
			}
			buf = append(buf, tuple...)
			count++
			tupleBytes += len(tuple)
		}
		if count == 0 {
			continue
		}
		s.m.Upserts.Add(count, tupleBytes)
		if s.phase == PhaseFinal {
			s.m.Final.Add(count, tupleBytes)
		}
		return Block{Kind: wire.BlockUpserts, Table: id, Count: uint32(count), Tuples: finishBlock(buf, start, count)}, true
	}
	return Block{}, false
}

// endRound closes a shipped round.
func (s *Stream) endRound() {
	s.round.reset()
	s.rKind, s.rTable, s.rNext = 0, 0, 0
	if s.phase == PhaseFinal {
		s.setPhase(PhaseDone)
		return
	}
	s.setPhase(PhaseBetweenRounds)
}

// behind reports whether slot slot of table id is behind the cursor: the
// snapshot has already passed it, so a change to it must be logged.
func (s *Stream) behind(id partition.TableID, slot partition.Slot) bool {
	i := int(id) - 1
	switch {
	case s.snapDone || i < s.snapTable:
		return true
	case i > s.snapTable:
		return false
	}
	return slot < s.snapPos
}

// observer is the Stream as the partition's Observer, kept off Stream's
// own method set so that only the partition reports changes.
type observer Stream

func (o *observer) OnInsert(id partition.TableID, slot partition.Slot) {
	(*Stream)(o).onChange(id, slot)
}

func (o *observer) OnUpdate(id partition.TableID, slot partition.Slot) {
	(*Stream)(o).onChange(id, slot)
}

func (o *observer) OnDelete(id partition.TableID, slot partition.Slot, key []byte) {
	s := (*Stream)(o)
	if !s.hear(id) || !s.behind(id, slot) {
		return
	}
	s.added(s.cur.logDelete(id, key))
}

// onChange logs an insert or update: the slot joins the dirty set.
func (s *Stream) onChange(id partition.TableID, slot partition.Slot) {
	if !s.hear(id) || !s.behind(id, slot) {
		return
	}
	s.added(s.cur.markDirty(id, slot))
}

// hear counts a change and reports whether the stream logs changes now.
func (s *Stream) hear(id partition.TableID) bool {
	switch s.phase {
	case PhaseInactive:
		// Deactivate removed the observer; a call now means someone
		// installed it again by hand. Nothing to log into.
		return false
	case PhaseFinal, PhaseDone:
		panic(fmt.Sprintf("cow: table %d changed during the final delta (phase %v): the partition must be held still from FinalDelta to Deactivate", id, s.phase))
	}
	s.m.Changes++
	return true
}
