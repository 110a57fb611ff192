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

// paceWaits are the feed arrival times of a source replica's queued txns,
// kept only while its snapshot is paced.
type paceWaits map[txnid.ID]time.Time
