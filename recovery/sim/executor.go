package sim

import (
	"fmt"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/wire"
)

// executor is the holder of an attempt's claim: the rejoin's driver on the
// destination node, which claims the task before its destination
// processor sends anything (recovery/claim: "Its executor calls Acquire
// before it sends anything"). It keeps the claim's lease alive every
// KeepaliveTicks, checks the claim every ClaimWindowTicks, and stops at
// the first check that finds the claim gone (or the task done by another
// attempt): it aborts its destination processor, which writes nothing
// more. The source processor runs on the source node under the
// supervisor's word and is fenced by the epoch alone.
//
// A pause (faultPause) freezes the executor: its destination processor
// gets no tick and no message, its feed waits, and its keepalives and
// checks stop. When it wakes it goes on from where it was, and its next
// check comes within one window (wakeCheck ticks later), as a process's
// overdue timer does.
type executor struct {
	id    int
	epoch uint64
	// holds: it believes it holds the claim. False once it learned it lost
	// it, released it, or died with its node.
	holds bool
	// dead: its node restarted; it released nothing.
	dead                   bool
	nextRefresh, nextCheck uint64
	// pausedUntil: frozen while tick < pausedUntil (0: not paused);
	// wakeCheck is when its first check comes after it wakes, in ticks.
	pausedUntil, wokeAt uint64
	wakeCheck           uint64
	// lostAt is when the coordinator deleted its claim (0: not yet).
	lostAt uint64
	// leaseDeadline is its own reckoning of when its lease runs out: its
	// last successful keepalive (or its claim) plus the TTL.
	leaseDeadline uint64
	// wroteAt is the last tick a message of its attempt was accepted by
	// the other side while its sender still ran.
	wroteAt uint64
}

func (x *executor) paused(tick uint64) bool { return tick < x.pausedUntil }

// pausedNow reports whether a's executor is frozen at the current tick.
func (w *world) pausedNow(a *attempt) bool { return a.x != nil && a.x.paused(w.tick) }

// attemptOf returns the attempt of epoch, or nil.
func (w *world) attemptOf(epoch uint64) *attempt {
	for _, a := range w.atts {
		if a.epoch == epoch {
			return a
		}
	}
	return nil
}

// claimFor makes a's executor claim the task. It reports false, and
// starts nothing, if the claim is held.
func (w *world) claimFor(a *attempt, id int) bool {
	ttl := uint64(w.k.ClaimTTLTicks)
	e, ok := w.coord.acquire(id, w.tick, ttl)
	if !ok {
		w.tracef("executor x%d: claim refused: %s", id, &w.coord)
		return false
	}
	a.epoch = e
	a.x = &executor{id: id, epoch: e, holds: true, nextRefresh: w.tick + uint64(w.k.KeepaliveTicks), nextCheck: w.tick + uint64(w.k.ClaimWindowTicks), leaseDeadline: w.tick + ttl}
	w.stats.Claims++
	w.tracef("executor x%d claims the task: epoch %d (rev %d), lease %d ticks", id, e, w.coord.rev, ttl)
	return true
}

// stepClaims is one tick of the coordinator and the executors: leases run
// out, executors keep theirs alive, check them at their window, and stop
// when they find them gone.
func (w *world) stepClaims() {
	if !w.claims {
		return
	}
	if e, ok := w.coord.expire(w.tick); ok {
		w.stats.ClaimsExpired++
		w.tracef("coordinator: claim of epoch %d expired (rev %d)", e, w.coord.rev)
		if a := w.attemptOf(e); a != nil && a.x != nil {
			a.x.lostAt = w.tick
		}
	}
	window := uint64(w.k.ClaimWindowTicks)
	for _, a := range w.atts {
		x := a.x
		if x == nil || !x.holds || x.paused(w.tick) {
			continue
		}
		if x.pausedUntil != 0 {
			x.pausedUntil, x.wokeAt = 0, w.tick
			x.nextCheck = w.tick + x.wakeCheck
			w.tracef("executor x%d wakes (epoch %d, destination %s); next check in %d ticks; %s", x.id, x.epoch, a.dstStateString(), x.wakeCheck, &w.coord)
		}
		if w.k.LeaseGuard && w.tick >= x.leaseDeadline && w.opts.Sabotage != SabotageIgnoreClaimLoss {
			// Its lease ran out by its own reckoning: it stops before it
			// does anything else (this runs before any delivery).
			w.stopExecutor(a, wire.AbortClaimLost, fmt.Sprintf("lease of epoch %d ran out at tick %d by its own reckoning", x.epoch, x.leaseDeadline))
			continue
		}
		if w.tick >= x.nextRefresh {
			x.nextRefresh = w.tick + uint64(w.k.KeepaliveTicks)
			if w.coord.keepalive(x.epoch, w.tick, uint64(w.k.ClaimTTLTicks)) {
				x.leaseDeadline = w.tick + uint64(w.k.ClaimTTLTicks)
			} else {
				w.tracef("executor x%d: keepalive of epoch %d fails", x.id, x.epoch)
			}
		}
		if w.tick >= x.nextCheck {
			x.nextCheck = w.tick + window
			switch {
			case !w.coord.holds(x.epoch) && w.opts.Sabotage == SabotageIgnoreClaimLoss:
				// Sabotage: the check misses the loss.
			case !w.coord.holds(x.epoch):
				w.stopExecutor(a, wire.AbortClaimLost, fmt.Sprintf("claim of epoch %d lost: %s", x.epoch, &w.coord))
			case w.coord.task.status == taskDone && w.coord.task.doneBy != x.epoch:
				w.stopExecutor(a, wire.AbortShutdown, fmt.Sprintf("task done by epoch %d", w.coord.task.doneBy))
			}
		}
		// Invariant (e): an executor learns it lost its claim within one
		// window of the loss, or of waking if it was frozen then.
		if x.holds && x.lostAt != 0 && w.tick >= max(x.lostAt, x.wokeAt)+window {
			w.violate("e", "executor x%d still believes it holds epoch %d, lost at tick %d (woke at %d), window %d", x.id, x.epoch, x.lostAt, x.wokeAt, window)
		}
	}
}

// stopExecutor stops a's executor: it no longer holds the claim, gives it
// back if it still has it, and aborts its destination processor.
func (w *world) stopExecutor(a *attempt, reason wire.AbortReason, why string) {
	x := a.x
	x.holds = false
	w.tracef("executor x%d stops: %s", x.id, why)
	if reason == wire.AbortClaimLost {
		a.claimLost = true
		w.stats.ClaimLostStops++
	} else {
		a.taskDone = true
	}
	if w.coord.release(x.epoch) {
		w.tracef("executor x%d releases its claim (rev %d)", x.id, w.coord.rev)
	}
	if !a.dstGone && !a.dst.State().Final() {
		a.dst.Abort(reason, why)
		w.afterCall(a)
	}
}

// onExecutorEnd runs when a's destination processor ended (aborted or
// live): the executor gives its claim back, if it still holds it.
func (w *world) onExecutorEnd(a *attempt) {
	x := a.x
	if x == nil || !x.holds {
		return
	}
	x.holds = false
	if w.coord.release(x.epoch) {
		w.tracef("executor x%d releases its claim (rev %d)", x.id, w.coord.rev)
	}
}

// pause freezes a's executor for n ticks; its first check after it wakes
// comes wakeCheck ticks later.
func (w *world) pause(a *attempt, n, wakeCheck uint64) {
	x := a.x
	x.pausedUntil = w.tick + n
	x.wakeCheck = min(wakeCheck, uint64(w.k.ClaimWindowTicks)-1)
	a.paused = true
	w.tracef("executor x%d (epoch %d) pauses for %d ticks, until tick %d; %s", x.id, x.epoch, n, x.pausedUntil, &w.coord)
}

// noteWrite records that a message of a's sending side was accepted by a
// running processor on the other side while its sender still ran: a write
// of a's executor. Invariant (e): at each receiving node, accepted writes
// never go back in epoch, so once a newer claim's attempt has written
// there, an older executor's messages, whatever it believes, change
// nothing; and at no tick do two executors that both believe they hold
// the claim both write.
func (w *world) noteWrite(a *attempt, toSrc bool, m wire.Message) {
	if !w.claims || a.x == nil {
		return
	}
	if _, ok := m.(*wire.Abort); ok {
		return // giving up is not a write
	}
	node := 0
	if !toSrc {
		node = 1
	}
	if a.epoch < w.writeEpoch[node] {
		w.violate("e", "%s node accepted %s of epoch %d after a write of epoch %d", sideName(toSrc), m.Type(), a.epoch, w.writeEpoch[node])
	}
	w.writeEpoch[node] = a.epoch
	a.x.wroteAt = w.tick
	w.checkHeld(a, m.Type().String())
	if !a.x.holds {
		return
	}
	for _, b := range w.atts {
		if b == a || b.x == nil || !b.x.holds || b.x.wroteAt != w.tick {
			continue
		}
		// Two executors that both believe they hold the claim both wrote
		// this tick: the older one, woken from a pause, acting before its
		// next check, and the node it writes to not having seen the newer
		// epoch yet. The epoch order above still holds. The lease guard
		// rules it out (the older one stops as it wakes, and no message
		// stays in flight for a TTL); without it, it is counted.
		if w.k.LeaseGuard {
			w.violate("e", "executors x%d (epoch %d) and x%d (epoch %d) both believe they hold the claim and both wrote at this tick", b.x.id, b.epoch, a.x.id, a.epoch)
		}
		w.stats.DualWriteTicks++
		w.tracef("both wrote: executors x%d (epoch %d) and x%d (epoch %d) both believe they hold the claim; in epoch order at the %s node", b.x.id, b.epoch, a.x.id, a.epoch, sideName(toSrc))
	}
}

// checkHeld: a write of a (or a going live) while the coordinator no
// longer holds a's claim. With the lease guard that cannot happen (an
// executor stops as its lease runs out by its own reckoning, and nothing
// it sent stays in flight that long); without it, it is counted.
func (w *world) checkHeld(a *attempt, what string) {
	if a.x == nil || w.coord.holds(a.epoch) || !a.x.holds {
		return
	}
	if w.k.LeaseGuard {
		w.violate("e", "%s of epoch %d accepted after its claim was lost (%s)", what, a.epoch, &w.coord)
	}
	w.stats.WritesAfterLoss++
}

// checkStopped: an executor that stopped writes nothing more (its
// processor's Abort, sent as it stops, is not a write).
func (w *world) checkStopped(a *attempt, m wire.Message) {
	if a.x == nil || a.x.holds || a.dst.State() == recovery.StateLive {
		return
	}
	if _, ok := m.(*wire.Abort); ok {
		return
	}
	w.violate("e", "executor x%d stopped, but its destination processor sent %s", a.x.id, m.Type())
}
