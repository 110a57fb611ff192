package node

import (
	"time"

	"golang.org/x/time/rate"

	"github.com/rejoin-db/rejoin/txnid"
)

// Pacing a source's snapshot by its partition's write latency
// (docs/DESIGN.md "The rejoin takes what the writes leave"). A source
// replica runs the partition's txns and ships the snapshot from the same
// goroutine, on the same cores as the writes' own path; flat out, the
// stream takes the CPU the writes need and their latency goes up tenfold.
// The replica measures how long each txn waited, from its feed's reader
// to its Done, and every paceWindowTicks the controller below sets the
// rate of the attempt's link: halved while more than one txn in
// paceSlowShare waited over Config.PaceTarget, raised by a fifth while
// none did too often, and unlimited again once it is back above what the
// stream ran at unpaced. Only the snapshot is paced: catch-up rounds and
// the handoff run flat out, since a round's shipping is what lets writes
// run (the change log's throttle) and the handoff holds them.
//
// Pacing never holds a txn and decides nothing the protocol depends on:
// it only spaces the link's writes, so the window fills and the source
// ships less often. It lives in the driver because its input is wall
// time.

const (
	// paceWindowTicks is the controller's window, in replica ticks.
	paceWindowTicks = 5
	// paceSlowShare: a window is slow if more than one txn in this many
	// waited over the target.
	paceSlowShare = 50
	// paceFloorBytes is the least rate a paced stream gets, per attempt,
	// so a rejoin under any write load ends (5M rows of 116 bytes over 4
	// partitions: about 35 s at the floor).
	paceFloorBytes = 4 << 20
)

// paceCtl is one source attempt's controller. Pure: waits and window
// ends in, a rate out.
type paceCtl struct {
	target time.Duration
	// n and slow count the txns observed in the window and those that
	// waited over target.
	n, slow int
	// rate is the link's rate in bytes per second; 0: unlimited.
	rate float64
	// free is the rate the stream ran at in the window before pacing
	// began: pacing ends once rate is back above it.
	free float64
	// starts counts the windows in which pacing began, for the status.
	starts int
	// ticks, at and sent are the window's: ticks counted, its start, and
	// the link's bytes written at its start.
	ticks int
	at    time.Time
	sent  int64
}

// begin starts a window at now, the link having written sent bytes.
func (p *paceCtl) begin(now time.Time, sent int64) {
	p.ticks, p.at, p.sent = 0, now, sent
}

// tick counts a tick at now, the link having written sent bytes; every
// paceWindowTicks it ends the window (window) and begins the next, and
// returns the rate and whether it changed.
func (p *paceCtl) tick(now time.Time, sent int64) (float64, bool) {
	if p.ticks++; p.ticks < paceWindowTicks {
		return p.rate, false
	}
	rate, changed := p.window(now.Sub(p.at), sent-p.sent)
	p.begin(now, sent)
	return rate, changed
}

// observe records one txn's wait.
func (p *paceCtl) observe(wait time.Duration) {
	p.n++
	if wait > p.target {
		p.slow++
	}
}

// window ends a window of d in which the link wrote sent bytes and
// returns the rate for the next one (0: unlimited) and whether it
// changed.
func (p *paceCtl) window(d time.Duration, sent int64) (float64, bool) {
	n, slow := p.n, p.slow
	p.n, p.slow = 0, 0
	old := p.rate
	unpaced := float64(sent) / max(d.Seconds(), 1e-3)
	switch {
	case n > 0 && slow*paceSlowShare > n && (p.rate > 0 || unpaced >= 2*paceFloorBytes):
		// Unpaced, a stream that shipped little in the window is not
		// what slowed the txns: nothing to take from it.
		cur := p.rate
		if cur == 0 {
			cur, p.free = unpaced, unpaced
			p.starts++
		}
		p.rate = max(paceFloorBytes, cur/2)
	case p.rate == 0:
	case n == 0:
		p.rate = 0 // no writes to leave room for
	default:
		p.rate *= 1.2
		if p.rate >= p.free {
			p.rate = 0
		}
	}
	return p.rate, p.rate != old
}

// paceLimit is a rate as the link's limiter takes it.
func paceLimit(bytesPerSec float64) rate.Limit {
	if bytesPerSec <= 0 {
		return rate.Inf
	}
	return rate.Limit(bytesPerSec)
}

// paceWaits measures each txn's wait while a source replica's snapshot
// is paced: from when it could have run to its Done. That is the later of
// its own arrival and the arrival of what raised the partition's safe
// point past it (a txn or a heartbeat of another holder). The wait for
// another holder's word is the sequencing's, which the stream neither
// causes nor shortens by slowing; counted, it held the stream at the
// floor on a cluster whose every holder sequences (docs/DESIGN.md "The
// rejoin takes what the writes leave"). What remains is the time the
// replica's goroutine, the node's cores, took to come to it.
type paceWaits struct {
	// arrived: each queued txn's arrival.
	arrived map[txnid.ID]time.Time
	// marks: the safe point's rises while txns waited, in order, each
	// with the arrival that raised it.
	marks []paceMark
	// last is the latest arrival taken in since the safe point was last
	// looked at; zero if none.
	last time.Time
}

type paceMark struct {
	safe txnid.ID
	at   time.Time
}

func newPaceWaits() *paceWaits {
	return &paceWaits{arrived: map[txnid.ID]time.Time{}}
}

// txn notes txn id's arrival at t.
func (w *paceWaits) txn(id txnid.ID, t time.Time) {
	w.arrived[id] = t
	w.took(t)
}

// took notes an arrival at t (a txn, a heartbeat) that may raise the
// safe point.
func (w *paceWaits) took(t time.Time) {
	w.last = later(w.last, t)
}

// look notes the safe point after what was taken in, at now, and whether
// txns are queued. A rise is owed to the latest arrival since the last
// look (now if none, as for an initiator no longer waited for). With
// nothing queued, no txn can come at or below the safe point, so no mark
// is needed.
func (w *paceWaits) look(safe txnid.ID, queued bool, now time.Time) {
	at := w.last
	w.last = time.Time{}
	if !queued {
		w.marks = w.marks[:0]
		return
	}
	if n := len(w.marks); n > 0 && safe <= w.marks[n-1].safe {
		return
	}
	if at.IsZero() {
		at = now
	}
	w.marks = append(w.marks, paceMark{safe: safe, at: at})
}

// ran reports the wait of txn id, run at now; false for a txn that
// arrived before the pacing began. IDs run in order, so the marks below
// id are spent.
func (w *paceWaits) ran(id txnid.ID, now time.Time) (time.Duration, bool) {
	i := 0
	for i < len(w.marks) && w.marks[i].safe < id {
		i++
	}
	w.marks = w.marks[:copy(w.marks, w.marks[i:])]
	t, ok := w.arrived[id]
	if !ok {
		return 0, false
	}
	delete(w.arrived, id)
	if len(w.marks) > 0 {
		t = later(t, w.marks[0].at)
	}
	return now.Sub(t), true
}
