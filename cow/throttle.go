package cow

import "github.com/rejoin-db/rejoin/txnid"

// throttle is the gate's state: how fast the log grows against how fast
// shipping drains it, and how many txns ran this tick. It is driven only
// by ticks and events (log bytes added, log bytes cut into blocks, txns
// asking to run), never by a clock, so a seeded run replays exactly.
//
// Three rules, checked before every txn (BeforeTxn):
//
//   - Hold: while the log is above holdAboveBytes (ChangeLogBytesMax -
//     ChangeLogTxnBytesMax) no txn runs. Shipping blocks, which never
//     waits for a txn, drains the log and lifts the hold.
//   - Round budget: while a catch-up round is in flight, a txn starts
//     only while the log being filled (the next round's) is empty or
//     holds less than half of what the round in flight started with. The
//     round's end lifts it. This is the rule that makes catch-up
//     converge (see roundBudgetSpent); it binds only when writes would
//     fill more than half a round in the time that round takes to ship.
//   - Pace: at a tick, if over the last window the log grew by more than
//     shipping drained and it is above the low-water mark, pacing starts:
//     at most PaceTxnsPerTick txns run per tick. It stops as soon as the
//     log is at or below the low-water mark. Pacing smooths the rate while
//     the snapshot ships; it cannot by itself make rounds shrink, since
//     its unit is txns, not the bytes shipping drains (a round of one-row
//     blocks may ship slower than PaceTxnsPerTick txns per tick dirty).
//
// None ever fails anything: throttling only slows the source.
type throttle struct {
	holdAboveBytes int
	lowWaterBytes  int
	paceTxns       int
	reserveBytes   int

	// addedRing and drainedRing hold the log bytes added and drained in
	// each of the last len(addedRing) ticks; at is the oldest. Invariant:
	// sumAdded and sumDrained are their sums.
	addedRing, drainedRing []int64
	at                     int
	sumAdded, sumDrained   int64
	// tickAdded and tickDrained count the tick in progress.
	tickAdded, tickDrained int64

	// roundStartBytes is the log bytes the round in flight (the last one
	// started) began with, R_k; the round budget lets the next round's
	// log grow to below half of it.
	roundStartBytes int

	pacing bool
	// txnsThisTick counts the txns let through since the last tick.
	txnsThisTick int

	// addedTotal counts every log byte ever added. txnOpen is set from
	// the moment BeforeTxn lets a txn run until the next call into the
	// stream from outside the observer, by which time that txn is over;
	// txnBase is addedTotal when it started.
	addedTotal int64
	txnOpen    bool
	txnBase    int64
}

func newThrottle(cfg Config) throttle {
	return throttle{
		holdAboveBytes: cfg.ChangeLogBytesMax - cfg.ChangeLogTxnBytesMax,
		lowWaterBytes:  cfg.PaceLowWaterBytes,
		paceTxns:       cfg.PaceTxnsPerTick,
		reserveBytes:   cfg.ChangeLogTxnBytesMax,
		addedRing:      make([]int64, cfg.ThrottleWindowTicks),
		drainedRing:    make([]int64, cfg.ThrottleWindowTicks),
	}
}

// added records n log bytes added by a change.
func (s *Stream) added(n int) {
	if n == 0 {
		return
	}
	th := &s.th
	th.addedTotal += int64(n)
	th.tickAdded += int64(n)
	s.m.LogBytesPeak = max(s.m.LogBytesPeak, s.LogBytes())
}

// drained records n log bytes cut into a block (or dropped at cutting).
func (s *Stream) drained(n int) {
	s.th.tickDrained += int64(n)
}

// closeTxn ends the accounting of the txn BeforeTxn last let through. It
// runs at every entry into the stream other than the observer's: the
// executor runs a txn entirely inside one Step, so by then it is over.
func (s *Stream) closeTxn() {
	th := &s.th
	if !th.txnOpen {
		return
	}
	th.txnOpen = false
	n := int(th.addedTotal - th.txnBase)
	s.m.TxnBytesPeak = max(s.m.TxnBytesPeak, n)
	if n > th.reserveBytes {
		s.m.TxnsOverReserve++
	}
}

// BeforeTxn implements partition.Gate: it reports whether the next txn
// may run now. It holds every txn while the log is above
// ChangeLogBytesMax - ChangeLogTxnBytesMax or while the round in flight's
// budget is spent, paces them while pacing, and holds everything from
// FinalDelta until Deactivate so that the partition stays exactly at the
// handoff point. Once the stream is inactive it lets everything through.
func (s *Stream) BeforeTxn(next txnid.ID) bool {
	s.closeTxn()
	th := &s.th
	switch s.phase {
	case PhaseInactive:
		return true
	case PhaseFinal, PhaseDone:
		s.m.TxnsHeldForHandoff++
		return false
	}
	if s.LogBytes() > th.holdAboveBytes {
		s.m.TxnsHeld++
		return false
	}
	if s.roundBudgetSpent() {
		s.m.TxnsHeldForRound++
		return false
	}
	s.maybeStopPacing()
	if th.pacing && th.txnsThisTick >= th.paceTxns {
		s.m.TxnsPaced++
		return false
	}
	th.txnsThisTick++
	th.txnOpen = true
	th.txnBase = th.addedTotal
	return true
}

// Tick advances the throttle's clock by one tick: it closes the tick's
// growth and drain into the window, starts or stops pacing, and lets
// PaceTxnsPerTick more txns through if pacing. The driver maps ticks to
// wall time.
func (s *Stream) Tick() {
	s.closeTxn()
	if s.phase == PhaseInactive {
		return
	}
	th := &s.th
	th.sumAdded += th.tickAdded - th.addedRing[th.at]
	th.sumDrained += th.tickDrained - th.drainedRing[th.at]
	th.addedRing[th.at], th.drainedRing[th.at] = th.tickAdded, th.tickDrained
	th.at = (th.at + 1) % len(th.addedRing)
	th.tickAdded, th.tickDrained = 0, 0
	th.txnsThisTick = 0

	s.maybeStopPacing()
	if !th.pacing && th.sumAdded > th.sumDrained && s.LogBytes() > th.lowWaterBytes {
		th.pacing = true
		s.m.PaceStarts++
	}
	s.m.Ticks++
	if th.pacing || s.LogBytes() > th.holdAboveBytes || s.roundBudgetSpent() {
		s.m.ThrottledTicks++
	}
}

// roundBudgetSpent reports whether the round in flight's budget is used
// up: the log being filled, which becomes the next round, is not empty
// and holds at least half of what the round in flight started with. An
// empty log always lets one txn in, so that a caller that starts round
// after round, empty ones included, never starves the executor.
//
// The bound it guarantees (docs/DESIGN.md, "Catch-up convergence"): let
// R_k be the log bytes round k starts with and T the most log bytes one
// txn adds (at most ChangeLogTxnBytesMax for every txn not counted in
// TxnsOverReserve). A txn starts during round k only while the new log
// is empty or holds less than R_k/2, and then adds at most T, so a caller
// that starts round k+1 as soon as round k is shipped (recovery.Source
// does, within the same call) gets
//
//	R_{k+1} <= R_k/2 + T,  hence  R_k <= R_1/2^(k-1) + 2T,
//
// whatever the block size, the window and the write rate: the rounds
// shrink geometrically to at most 2T, all rounds together ship at most
// 2*R_1 + 2T per round, and each round ends once its R_k bytes are cut
// into blocks, which never waits for a txn. R_1, what the snapshot left,
// is at most ChangeLogBytesMax (the hold). Changes logged between rounds,
// by a caller that waits there, are not limited.
func (s *Stream) roundBudgetSpent() bool {
	return s.phase == PhaseRound && s.cur.bytes > 0 && 2*s.cur.bytes >= s.th.roundStartBytes
}

// RoundBudgetSpent reports whether the gate holds every txn until the
// round in flight is shipped, because the next round's log already holds
// half of what this round started with.
func (s *Stream) RoundBudgetSpent() bool { return s.roundBudgetSpent() }

// maybeStopPacing ends pacing once the log is at or below the low-water
// mark. At, not only below: with a mark of 0, pacing must end when the log
// is empty.
func (s *Stream) maybeStopPacing() {
	if s.th.pacing && s.LogBytes() <= s.th.lowWaterBytes {
		s.th.pacing = false
	}
}

// Pacing reports whether the throttle is pacing txns.
func (s *Stream) Pacing() bool { return s.th.pacing }

// Holding reports whether the log is above the hold mark, so that the
// gate holds every txn until shipping drains it.
func (s *Stream) Holding() bool {
	return s.phase != PhaseInactive && s.LogBytes() > s.th.holdAboveBytes
}
