package sim

import (
	"fmt"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/wire"
)

// faultKind is what a fault does to an attempt.
type faultKind uint8

const (
	// faultAbortSource: the source side aborts (it shuts down, or loses
	// its claim) and tells the destination.
	faultAbortSource faultKind = iota
	// faultAbortDest: the destination side aborts likewise.
	faultAbortDest
	// faultNodeFailed: a node of the partition failed, and the destination
	// terminates its rejoin (DESIGN.md step 8, "hara kiri").
	faultNodeFailed
	// faultCut: the connection is cut; what is in flight is lost and each
	// side learns of it after a delay, or never and times out.
	faultCut
	// faultRestart: the destination node restarts: its processor and its
	// replica vanish, the connection with them; the next attempt starts on
	// a fresh empty replica.
	faultRestart
	// faultPause: the holder of the attempt's claim, on the source node,
	// freezes (GC, SIGSTOP, a VM stall) with its source processor and its
	// connection for longer than the claim's TTL: its claim expires, the
	// supervisor assigns the task again, the source node starts a new
	// attempt with a new claim, and when the holder wakes its late
	// messages reach the new attempt's processors.
	faultPause
	// faultSupervisor: the supervisor dies; a new leader is elected after
	// a delay and carries on from the coordinator's record. It ends no
	// attempt.
	faultSupervisor
	// faultOutage: the coordinator answers nothing for a while (etcd
	// unreachable): keepalives, checks, record writes, the destination's
	// claim check and the supervisor's passes all fail. Past a window the
	// holder counts its claim lost and stops; a new attempt follows once
	// the coordinator is back. A third of them (those drawn without a
	// late route, which an outage has no use for) cut only the attempt's
	// source node off from the coordinator, which runs on for everyone
	// else: the holder's keepalives, checks and writes are lost, and a
	// window after its last answered check its guard counts the claim
	// lost and it stops, before its lease can have run out; once it has,
	// the supervisor assigns the task to the other source.
	faultOutage
	// faultSourceDies: the attempt's source node dies (its process is
	// gone): its replica, its source processor and its holder with it,
	// releasing nothing. The destination is told after a delay, or never
	// and times out. Its registration's lease runs out half a claim TTL
	// later, and the supervisor (Decide) assigns the task to the other
	// live source, revoking the claim if it still stands: a new attempt, a
	// higher epoch. At most one per run, and only with two sources.
	faultSourceDies
	faultKinds
)

var faultNames = [...]string{"abort-source", "abort-destination", "node-failed", "cut", "restart-destination", "pause-holder", "supervisor-dies", "coordinator-outage", "source-dies"}

func (k faultKind) String() string { return faultNames[k] }

// FaultKindNames names the fault kinds in the order of Stats.Kinds.
func FaultKindNames() []string { return append([]string(nil), faultNames[:]...) }

// phase is the part of an attempt a fault waits for.
type phase uint8

const (
	phaseHandshake phase = iota // proposing, answering, executing up to S
	phaseSnapshot               // the source is streaming the snapshot
	phaseCatchUp                // catch-up rounds
	phaseHandoff                // the final delta is shipping, or the Handoff is on its way
	phases
)

var phaseNames = [...]string{"handshake", "snapshot", "catch-up", "handoff"}

func (p phase) String() string { return phaseNames[p] }

// PhaseNames names the phases in the order of Stats.Phases.
func PhaseNames() []string { return append([]string(nil), phaseNames[:]...) }

// fault is one planned fault: it fires on the first attempt that spends
// wait+1 ticks in its phase, one fault per attempt at most.
type fault struct {
	kind   faultKind
	phase  phase
	wait   int
	reason wire.AbortReason // for the abort kinds
	// learn delays for a cut or restart, 0 for never; ghost: the cut
	// sides' late messages travel on.
	srcLearn, dstLearn int
	ghost              bool
	// pauseTicks and wakeCheck for a pause (see world.pause); election
	// for a supervisor's death; outageTicks for an outage.
	pauseTicks, wakeCheck int
	// shortPause > 0: the pause ends this many ticks after the holder's
	// lease runs out by its own reckoning, instead of after pauseTicks.
	shortPause  int
	election    int
	outageTicks int
	inGap       bool // a supervisor's death waits for no claim, not for a phase
	fired       bool
}

// planFaults draws the run's faults from the fault stream, all at once, so
// the plan does not depend on how the run unfolds.
func (w *world) planFaults() {
	r := w.faultRng
	deaths := 0
	for i := 0; i < w.k.Faults; i++ {
		f := &fault{kind: faultKind(r.IntN(int(faultKinds))), phase: phase(r.IntN(int(phases)))}
		waits := [phases]int{phaseHandshake: 10, phaseSnapshot: 80, phaseCatchUp: 20, phaseHandoff: 3}
		f.wait = r.IntN(waits[f.phase])
		f.reason = [...]wire.AbortReason{wire.AbortShutdown, wire.AbortClaimLost}[r.IntN(2)]
		if f.kind == faultNodeFailed {
			f.reason = wire.AbortNodeFailed
		}
		learn := func() int {
			if r.IntN(5) == 0 {
				return 0
			}
			return 1 + r.IntN(30)
		}
		f.srcLearn, f.dstLearn = learn(), learn()
		f.ghost = r.IntN(3) != 0
		// Longer than the TTL, so the claim expires while the holder is
		// frozen; a third of the time long enough that a new attempt runs
		// when it wakes, the rest (shortPause) just past its lease, so
		// that it wakes before one does, its destination still running.
		ttl := w.k.ClaimTTLTicks
		short, extra := r.IntN(3) != 0, r.IntN(ttl+120)
		f.pauseTicks = ttl + 1 + extra
		if short {
			f.shortPause = 1 + extra%4
		}
		f.wakeCheck = r.IntN(max(1, w.k.ClaimWindowTicks))
		f.election = 1 + r.IntN(max(1, w.k.ElectionTicksMax))
		f.inGap = r.IntN(2) == 0
		// Mostly past a claim window, so the holder gives up; now and
		// then shorter, so it rides the outage out.
		f.outageTicks = 1 + r.IntN(w.k.ClaimWindowTicks+2*ttl)
		if f.kind == faultSourceDies && (w.k.Sources < 2 || deaths > 0) {
			f.kind = faultAbortSource // one source must live on
		}
		if f.kind == faultSourceDies {
			deaths++
		}
		w.faults = append(w.faults, f)
	}
}

// phaseOf reports which phase a running attempt is in.
func phaseOf(a *attempt) (phase, bool) {
	switch a.src.State() {
	case recovery.StateAnswering, recovery.StateAwaitingBoundary:
		return phaseHandshake, true
	case recovery.StateStreaming:
		return phaseSnapshot, true
	case recovery.StateCatchingUp:
		return phaseCatchUp, true
	case recovery.StateHandingOff, recovery.StateDone:
		return phaseHandoff, true
	}
	return 0, false
}

// maybeFault fires the next planned fault if the current attempt is where
// it waits.
func (w *world) maybeFault() {
	if w.scripted || w.live != nil {
		return
	}
	a := w.cur()
	var f *fault
	for _, g := range w.faults {
		if g.fired {
			continue
		}
		if g.kind == faultSupervisor && g.inGap {
			// It waits for the task to have no claim (an attempt just
			// ended): the supervisor dies with the next attempt planned
			// in its memory alone. It holds up no other fault.
			if c := &w.coord; !w.sup.dead && c.claim == nil && c.task.Attempts > 0 && !c.task.Status.Final() {
				w.fire(g, a)
			}
			continue
		}
		if f == nil {
			f = g
		}
	}
	if f == nil || a == nil || a.src == nil || !a.dstUp() || a.fault != nil || a.dst.State().Final() {
		return
	}
	ph, ok := phaseOf(a)
	if !ok || ph != f.phase {
		return
	}
	if f.kind == faultSourceDies {
		for _, sr := range w.srcs {
			if sr != a.sn && (sr.out() || sr.unsettled() || sr.breaking()) {
				// One source must live on: the other may be about to
				// fail for what it missed while away (registration.go),
				// or on a feed that cannot resume (feedbreak.go).
				f.kind = faultAbortSource
			}
		}
	}
	if f.kind == faultAbortSource && a.src.State().Final() {
		return // a source that has handed off has nothing left to abort
	}
	if (f.kind == faultPause || f.kind == faultOutage || f.kind == faultSourceDies) && (a.x == nil || !a.x.holds || w.pausedNow(a) || w.coord.down(w.tick)) {
		return
	}
	if f.kind == faultSupervisor && w.sup.dead {
		return // one leader dies at a time
	}
	if f.wait > 0 {
		f.wait--
		return
	}
	w.fire(f, a)
}

func (w *world) fire(f *fault, a *attempt) {
	f.fired = true
	if f.kind != faultSupervisor {
		a.fault = f // a supervisor's death ends no attempt
	}
	w.stats.FaultsFired++
	w.stats.Kinds[f.kind]++
	if f.inGap && f.kind == faultSupervisor {
		w.tracef("FAULT %s while the task has no claim (%s)", f.kind, &w.coord)
		w.killSupervisor(f.election)
		return
	}
	w.stats.Phases[f.phase]++
	w.tracef("FAULT %s in %s of attempt %d (source %s, destination %s)", f.kind, f.phase, a.epoch, a.src.State(), a.dst.State())
	switch f.kind {
	case faultAbortSource:
		a.sn.core.AbortSource(a.epoch, f.reason, fmt.Sprintf("injected %s", f.reason))
		w.afterCall(a)
	case faultAbortDest:
		w.dst.AbortDestination(a.epoch, f.reason, fmt.Sprintf("injected %s", f.reason))
		w.afterCall(a)
	case faultNodeFailed:
		w.dst.AbortDestination(a.epoch, wire.AbortNodeFailed, "a node of the partition failed")
		w.afterCall(a)
	case faultCut:
		w.cut(a, f.srcLearn, f.dstLearn, f.ghost)
	case faultRestart:
		w.restartDestination(a, f.srcLearn, f.ghost)
	case faultPause:
		n := uint64(f.pauseTicks)
		if f.shortPause > 0 {
			n = uint64(max(1, a.x.guard.LeaseDeadline()-int64(w.tick))) + uint64(f.shortPause)
		}
		w.pause(a, n, uint64(f.wakeCheck))
	case faultSupervisor:
		w.killSupervisor(f.election)
	case faultOutage:
		if f.ghost {
			w.outage(uint64(f.outageTicks))
		} else {
			w.cutOff(a.sn.id, uint64(f.outageTicks))
		}
	case faultSourceDies:
		w.sourceDies(a, f.dstLearn)
	}
}

// sourceDies makes a's source node die: its replica, its processors and
// its holder are gone (the holder releases nothing: its claim runs out or
// is revoked), its registration goes when its lease runs out, and the
// destination learns of the broken connection dstLearn ticks later (0:
// never, it times out).
func (w *world) sourceDies(a *attempt, dstLearn int) {
	sr := a.sn
	sr.dead = true
	for _, b := range w.atts {
		if b.sn == sr && b.x != nil && !b.x.finished {
			b.x.holds, b.x.dead = false, true
		}
	}
	// Its registration's lease is half the claim's here, so the supervisor
	// often finds the source dead while its claim still stands, and
	// revokes it with the new assignment.
	w.coord.nodeDies(w.tick, uint64(max(1, w.k.ClaimTTLTicks/2)), sr.id)
	w.tracef("%s node dies: its replica, its processors and its holder are gone", sr.id)
	// Its connections close with it: every initiator's open feed there
	// breaks, as recovery/node's feed sees the reset, and is never
	// redialled (the node is dead). Left open, the feed's log would take
	// txns no one acknowledges until it is full, and refuse the
	// partition's calls (recovery.ErrFeedLogFull).
	for _, in := range w.inits {
		if !in.silent && in.core.Fed(sr.id) {
			w.breakFeed(in, sr, untilRedial)
		}
	}
	w.cut(a, 0, dstLearn, false)
}

// cutOff cuts node off from the coordinator for n ticks.
func (w *world) cutOff(node string, n uint64) {
	w.coord.cut(w.tick, n, node)
	w.stats.CutOffs++
	w.tracef("%s node: cut off from the coordinator for %d ticks, until tick %d", node, n, w.tick+n)
}

// outage makes the coordinator answer nothing for n ticks.
func (w *world) outage(n uint64) {
	w.coord.outage(w.tick, n)
	w.stats.Outages++
	w.tracef("coordinator: unreachable for %d ticks, until tick %d", n, w.coord.downUntil)
}

// restartDestination makes a's destination node restart: the processor and
// its replica are gone, and the connection with them. The claim's holder
// is on the source node and lives on: it learns of the cut and requeues.
// The node's fence is durable and survives: the restarted node's replica
// core starts from it.
func (w *world) restartDestination(a *attempt, srcLearn int, ghost bool) {
	w.dst = w.newDstReplica(w.dst.Fence())
	a.dstGone = true
	a.feed = nil
	a.exec = nil
	w.tracef("attempt %d: destination node restarts; its replica is gone", a.epoch)
	w.cut(a, srcLearn, 0, ghost)
}
