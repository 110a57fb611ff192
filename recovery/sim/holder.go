package sim

import (
	"errors"
	"fmt"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// holder is the holder of an attempt's claim: the rejoin's driver on the
// source node, where the product holds it (recovery/node/source.go). The
// source node's executor takes an assignment (sourceNode) and acquires
// the claim (its epoch is the attempt's); from then on the attempt core,
// the node's own (supervise.Holding), decides: it starts the task, says
// hello to the destination, starts its source processor on the answer,
// and at the end completes or requeues the task and releases the claim.
// The claim's guard (claim.Guard, the node's own too) keeps the lease
// alive, checks the claim ChecksPerWindow times a window, touches the
// task record when the attempt made progress (at most once a window),
// and at the first check that finds the claim gone, or after a window
// without an answered check, counts it lost; with Knobs.LeaseGuard the
// holder also stops as soon as the guard no longer holds the claim
// certainly, before it does anything else, and before its processor
// sends anything. Stopping, it tells its core the claim is lost, which
// aborts its source processor: it writes nothing more.
//
// A pause (faultPause) freezes the holder with its source processor and
// its connection, both ways: no keepalive, no check, no tick, nothing in
// or out. The source node's executor goes on, and starts a newer attempt
// if the supervisor assigns one (it then aborts the frozen processor, as
// the node's replica goroutine does). When the holder wakes it goes on
// from where it was, and its guard's first look comes wakeCheck ticks
// later, as a process's overdue timer fires.
type holder struct {
	id    int
	node  string // the source node it runs on
	sn    *srcReplica
	exec  string // executor id: "src/x<id>", as supervise.ExecutorID names the node
	epoch uint64
	guard *claim.Guard
	// h is the attempt core, the node's own (supervise.Holding): it
	// decides the attempt's life from the claim to its release, and
	// holdDo does what it asks on the model. a is its attempt, once its
	// first dial (the hello) went out.
	h *supervise.Holding
	a *attempt
	// holds: it believes it holds the claim. False once it learned it lost
	// it, released it, or died with its node.
	holds bool
	// dead: its node restarted; it released nothing.
	dead bool
	// finished: the attempt's outcome went to the record (its core asked
	// the completion or the requeue) or its task never started.
	finished bool
	// pausedUntil: frozen while tick < pausedUntil (0: not paused); its
	// guard's first look after it wakes comes at dueFrom.
	pausedUntil, wokeAt, wakeCheck, dueFrom uint64
	// lostAt is when the coordinator deleted its claim (0: not yet).
	lostAt uint64
	// wroteAt is the last tick a message of its attempt was accepted by
	// the other side while its sender still ran.
	wroteAt uint64
}

func (x *holder) paused(tick uint64) bool { return tick < x.pausedUntil }

func (x *holder) attempt() claim.Attempt {
	return claim.Attempt{Task: simTask, Executor: x.exec, Epoch: x.epoch}
}

// srcReplica is a source node: its live replica of the partition (every
// one gets the whole feed), and its executor (recovery/node's executor
// loop), which polls its assignments and takes each new one (a higher
// Seq) as one claim and one attempt; after a failed attempt it takes the
// same assignment again, retryAt later. A node that died (faultSourceDies)
// runs nothing more: its replica, its processors and its holder are gone.
type srcReplica struct {
	id string
	// core is the node's replica core, as recovery/node runs it: it owns
	// the executor and the source attempt, and steps, pumps and ticks
	// them. exec is its executor, for the checks.
	core *recovery.Replica
	exec *partition.Executor
	dead bool
	// taken is the node's record of the assignments it took, by the
	// rule the node's executor uses (supervise.Taken).
	taken    supervise.Taken
	nextPoll uint64
	retryAt  uint64 // 0: no retry pending
	// loss is its lost registration until settled (registration.go);
	// failed: the settlement, or a feed re-opened by the same process,
	// failed its replica, which is then out of the run.
	loss   *regLoss
	failed bool
	// held: its replica may lack txns and no other was live to rebuild
	// it from (recovery.Replica.Lose): out of the run as a failed one is,
	// but it keeps its content, which hold recorded as it stood then
	// (the oracle's look at it: holds.go).
	held bool
	hold *holdRecord
	// took lists the txns its core took in, in order, for the oracle's
	// count of what a held replica lacks.
	took []txnid.ID
	// gated: the last assignment it left, unsettled.
	gated uint32
	// Per initiator (by index): conns numbers its feed's connection here
	// (0: none yet); told is what each of its hellos said it missed, by
	// the hello's connection number; broke: its feed here broke while it
	// lives.
	conns []uint64
	told  map[int][]toldHello
	broke []bool
	// Per initiator too (feedbreak.go): recv is the last ID the node read
	// on its current feed; redialAt, for a broken one, the tick from which
	// the node is in reach again; dialing, a redial whose answer is on its
	// way; gapTxns, txns of a broken feed lost in flight. brokeAt is the
	// tick a feed here last broke.
	recv     []txnid.ID
	redialAt []uint64
	dialing  []*pendingDial
	gapTxns  []int
	brokeAt  uint64
	// tails is what its replica kept of each initiator's txns for the
	// repair of a dead initiator's tail (silent.go).
	tails recovery.Tails
	// joined, per initiator: its replica tracks the initiator by a join
	// on the current feed, or from the start; without Knobs.Joins, from
	// the feed's opening. A feed taken up keeps it, as the node keeps a
	// resumed feed's joins.
	joined []bool
}

// toldHello is what one feed hello said (wire.Hello.Missed), numbered by
// its connection (world.conns).
type toldHello struct {
	conn   uint64
	missed []uint32
}

// liveSources returns the executors of the source replicas whose node
// lives.
func (w *world) liveSources() []*partition.Executor {
	var out []*partition.Executor
	for _, sr := range w.srcs {
		if !sr.out() {
			out = append(out, sr.exec)
		}
	}
	return out
}

// pausedNow reports whether a's holder is frozen at the current tick.
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

// stepSourceNodes is one tick of every live source node's executor: a
// retry comes due, and at its poll it reads its assignment and takes a
// new one.
func (w *world) stepSourceNodes() {
	for _, n := range w.srcs {
		if n.out() {
			continue
		}
		if n.retryAt != 0 && w.tick >= n.retryAt {
			n.retryAt = 0
			n.taken.Retry(simTask)
		}
		if w.tick < n.nextPoll {
			continue
		}
		n.nextPoll = w.tick + 1 + uint64(w.net.IntN(w.ctrlDelayMax()))
		if w.coord.unreachable(w.tick, n.id) {
			continue
		}
		if n.unsettled() {
			// No claim before its lost registration is settled: its
			// replica may be about to fail for what it missed (the
			// node's settledTerm gate).
			if as, ok, err := w.coord.assignment(w.tick, n.id); err == nil && ok && newerThanTaken(n.taken, as) {
				if w.stats.GateHeld == 0 || as.Seq != n.gated {
					w.tracef("%s node: leaves assignment seq %d until its lost registration is settled", n.id, as.Seq)
				}
				n.gated = as.Seq
				w.stats.GateHeld++
			}
			continue
		}
		as, ok, err := w.coord.assignment(w.tick, n.id)
		if err != nil || !ok {
			continue
		}
		if n.taken == nil {
			n.taken = supervise.Taken{}
		}
		if !n.taken.Take(as) {
			continue
		}
		w.tracef("%s node: takes assignment seq %d (%s)", n.id, as.Seq, as.Reason)
		w.takeAssignment(n)
	}
}

// takeAssignment is source node sr's executor taking its assignment: it
// acquires the claim and hands the attempt to its core, which starts the
// task and says hello to the destination (holdDo). A claim not taken or a
// task that will not start leaves nothing behind.
func (w *world) takeAssignment(sr *srcReplica) *attempt {
	id := w.coord.claims + 1
	x := &holder{id: id, node: sr.id, sn: sr, exec: fmt.Sprintf("%s/x%d", sr.id, id)}
	ttl := uint64(w.k.ClaimTTLTicks)
	e, err := w.coord.acquire(w.tick, ttl, x.exec, sr.id)
	if err != nil {
		w.tracef("%s node: claim not taken: %v", sr.id, err)
		return nil
	}
	x.epoch, x.holds = e, true
	x.guard, err = claim.NewGuard(claim.GuardConfig{TTL: int64(ttl), Window: int64(w.k.ClaimWindowTicks), Keepalive: int64(w.k.KeepaliveTicks)}, int64(w.tick))
	if err != nil {
		w.violate("knobs", "claim guard: %v", err)
	}
	if x.h, err = supervise.NewHolding(w.k.holdingConfig(), int64(w.tick)); err != nil {
		w.violate("knobs", "attempt core: %v", err)
	}
	w.stats.Claims++
	w.tracef("holder x%d claims the task: epoch %d, lease %d ticks", id, e, ttl)
	w.holdDo(x)
	return x.a
}

// holdDo does what x's attempt core asked, feeding each result back,
// until it asks nothing more: recovery/node's holdAttempt on the model.
func (w *world) holdDo(x *holder) {
	x.h.Run(func(act supervise.HoldAction) { w.holdAction(x, act) })
}

// holdAction does one thing x's core asked.
func (w *world) holdAction(x *holder, act supervise.HoldAction) {
	now := int64(w.tick)
	a := x.a
	switch act.Kind {
	case supervise.HoldStartTask:
		// Asked at once after the claim, at the tick its node reached the
		// coordinator.
		_, err := w.coord.startTask(w.tick, x.attempt())
		if err != nil {
			x.finished = true
			w.stats.StartsRefused++
			w.tracef("holder x%d: task not started: %v", x.id, err)
		}
		x.h.TaskStarted(now, err)
	case supervise.HoldDial:
		if a == nil {
			x.a = w.startAttempt(x.sn, x, 0)
			return
		}
		// A redial: its answer comes a few ticks later (redials).
		w.redialLater(a)
	case supervise.HoldStartSource:
		x.h.SourceStarted(now, w.startSource(a))
	case supervise.HoldResumeSource:
		err := a.sn.core.ResumeSource(a.epoch)
		if err != nil {
			w.violate("c", "attempt %d: source refused to resume: %v", a.epoch, err)
		}
		x.h.SourceStarted(now, err)
		w.afterCall(a)
	case supervise.HoldAbortSource:
		switch act.GaveUp {
		case supervise.GaveUpHeld:
			w.stats.HoldsGivenUp++
			w.tracef("src e%d: %s", a.epoch, act.Why)
		case supervise.GaveUpGrace:
			w.stats.GraceExpired++
			w.tracef("src e%d: %s", a.epoch, act.Why)
		}
		if a.src != nil && !a.src.State().Final() {
			a.sn.core.AbortSource(a.epoch, act.Reason, act.Why)
			w.afterCall(a)
		}
	case supervise.HoldClose:
		if a != nil && a.src == nil && !a.closed {
			w.closeBeforeSource(a, errors.New(act.Why))
		}
	case supervise.HoldComplete:
		x.finished = true
		x.h.Finished(now, w.completeTask(a, x.attempt(), "source"))
	case supervise.HoldRequeue:
		x.finished = true
		if a != nil && a.src == nil && a.helloErr == nil {
			a.helloErr = errors.New(act.Why)
		}
		err := w.reach(x)
		if err == nil {
			_, err = w.coord.requeue(w.tick, x.attempt(), act.Why)
		}
		switch {
		case errors.Is(err, claim.ErrTaskFinal):
			w.tracef("holder x%d: attempt failed, but the task is final", x.id)
		case err != nil:
			w.tracef("holder x%d: requeue: %v", x.id, err)
		default:
			w.stats.Requeues++
			w.tracef("holder x%d requeues the task: %s", x.id, act.Why)
		}
		x.h.Finished(now, err)
	case supervise.HoldRelease:
		w.releaseHolder(x)
		if a != nil && a.src == nil && !a.closed {
			// The attempt is over before its source started: the dial
			// still out is cancelled, its connection closed.
			w.closeBeforeSource(a, errors.New("attempt over before its source started"))
		}
	case supervise.HoldRetry:
		// The node takes the assignment again at its next poll after the
		// core's delay.
		retry := uint64(act.At) - w.tick + uint64(w.net.IntN(30))
		x.sn.retryAt = w.tick + retry
		w.tracef("holder x%d: retry in %d ticks", x.id, retry)
	}
}

// stepHolders is one tick of every holder that believes it holds its
// claim: it wakes from a pause, applies the lease guard, runs what its
// guard says is due (keepalive, check), and touches the task record on
// progress; and every attempt whose source side is over is finished.
func (w *world) stepHolders() {
	if !w.claims {
		return
	}
	window := uint64(w.k.ClaimWindowTicks)
	for _, a := range w.atts {
		x := a.x
		if x == nil || x.dead || x.paused(w.tick) {
			continue
		}
		if x.pausedUntil != 0 {
			x.pausedUntil, x.wokeAt = 0, w.tick
			x.dueFrom = w.tick + x.wakeCheck
			w.tracef("holder x%d wakes (epoch %d, source %s); its guard looks in %d ticks; %s", x.id, x.epoch, a.srcStateString(), x.wakeCheck, &w.coord)
		}
		if x.holds {
			w.guardHolder(a)
		}
		// Invariant (e): a holder learns it lost its claim within one
		// window of the loss, or of waking if it was frozen then.
		if x.holds && x.lostAt != 0 && w.tick >= max(x.lostAt, x.wokeAt)+window {
			w.violate("e", "holder x%d still believes it holds epoch %d, lost at tick %d (woke at %d), window %d", x.id, x.epoch, x.lostAt, x.wokeAt, window)
		}
		if !x.finished && a.src != nil && a.src.State().Final() {
			var err error
			if a.src.State() != recovery.StateDone {
				if err = a.src.Err(); err == nil {
					err = errors.New("ended")
				}
			}
			x.h.SourceEnded(int64(w.tick), err)
			w.holdDo(x)
		}
	}
}

// guardHolder runs a's holder's guard for this tick.
func (w *world) guardHolder(a *attempt) {
	x := a.x
	blind := w.opts.Sabotage == SabotageIgnoreClaimLoss
	if w.tick >= x.dueFrom {
		w.guardDue(a, blind)
	}
	if !x.holds {
		return
	}
	if w.k.LeaseGuard && !blind && !x.guard.Held(int64(w.tick)) {
		// Not certainly held: it stops before it does anything else (this
		// runs before any delivery). A holder just woken from a pause
		// stops here, before its guard's first look.
		w.stopHolder(a, wire.AbortClaimLost, fmt.Sprintf("claim of epoch %d not certainly held since tick %d", x.epoch, x.guard.HeldUntil()))
		return
	}
	if w.tick < x.dueFrom {
		return
	}
	if a.src != nil && !a.src.State().Final() && x.guard.MaybeTouch(int64(w.tick), a.src.Progress()) {
		if err := w.reach(x); err != nil {
			w.tracef("holder x%d: touch: %v", x.id, err)
		} else if _, err := w.coord.touch(w.tick, x.attempt()); err != nil {
			w.tracef("holder x%d: touch: %v", x.id, err)
		} else {
			w.stats.Touches++
			if w.tr.on && w.scripted {
				w.tracef("holder x%d touches the task record (progress %d)", x.id, a.src.Progress())
			}
		}
	}
}

// guardDue runs what a's holder's guard says is due this tick: a
// keepalive, a check (answered at once, or not at all while the
// coordinator is down), and stops the holder if the guard counts the
// claim lost.
func (w *world) guardDue(a *attempt, blind bool) {
	x := a.x
	ka, check := x.guard.Due(int64(w.tick))
	if ka && w.reach(x) == nil {
		if alive, ok := w.coord.keepalive(w.tick, x.epoch, uint64(w.k.ClaimTTLTicks)); ok {
			if !alive {
				w.tracef("holder x%d: keepalive of epoch %d: lease gone", x.id, x.epoch)
			}
			x.guard.OnKeepalive(int64(w.tick), alive || blind)
		}
	}
	if check {
		err := w.reach(x)
		if err == nil {
			err = w.coord.check(w.tick, x.epoch)
		}
		if blind && err != nil && !errors.Is(err, errCoordDown) {
			err = nil // Sabotage: the check misses the loss.
		}
		x.guard.OnCheck(int64(w.tick), err)
	}
	if blind && x.guard.Lost() && !errors.Is(x.guard.Err(), claim.ErrUnreachable) {
		return
	}
	if x.guard.Lost() {
		w.stopHolder(a, wire.AbortClaimLost, fmt.Sprintf("claim of epoch %d lost: %v", x.epoch, x.guard.Err()))
	}
}

// stopHolder stops a's holder: it no longer believes it holds the claim,
// and its core aborts its source processor, which writes nothing more, or
// ends the attempt before its source started.
func (w *world) stopHolder(a *attempt, reason wire.AbortReason, why string) {
	x := a.x
	x.holds = false
	w.tracef("holder x%d stops: %s", x.id, why)
	if reason == wire.AbortClaimLost {
		a.claimLost = true
		w.stats.ClaimLostStops++
	}
	x.h.ClaimLost(int64(w.tick), why)
	w.holdDo(x)
}

// releaseHolder gives x's claim back, if it is still its (Claim.Release);
// if the coordinator does not answer, the lease runs out by itself.
func (w *world) releaseHolder(x *holder) {
	x.holds = false
	x.guard.Release()
	var ok bool
	err := w.reach(x)
	if err == nil {
		ok, err = w.coord.release(w.tick, x.epoch)
	}
	switch {
	case err != nil:
		w.tracef("holder x%d: release of epoch %d: %v", x.id, x.epoch, err)
	case ok:
		w.tracef("holder x%d releases its claim (rev %d)", x.id, w.coord.rev)
	}
}

// completeRetryTicks spaces the live destination's tries at completing
// its task (recovery/node's completeLive).
const completeRetryTicks = 10

// completeTask is supervise.Complete on the model, by the source (done by
// the HandoffAck) or by the destination (gone live); it returns the
// coordinator's answer. Both complete the
// task; whichever comes second is a duplicate, ignored. The destination
// tries again until the coordinator takes it: if both failed in an
// outage, the task would stay open and send new attempts to a replica
// that refuses them as live.
func (w *world) completeTask(a *attempt, att claim.Attempt, by string) error {
	var err error
	if by == "source" {
		err = w.reach(a.x)
	}
	if err == nil {
		_, err = w.coord.complete(w.tick, att)
	}
	if by == "destination" {
		w.dstComplete = nil
		if supervise.CompleteAgain(err) {
			w.dstComplete, w.dstCompleteAt = a, w.tick+completeRetryTicks
		}
	}
	switch {
	case errors.Is(err, claim.ErrDuplicate):
		w.tracef("%s e%d: completion is a duplicate, ignored", sideName(by == "source"), a.epoch)
	case err != nil:
		w.tracef("%s e%d: complete: %v", sideName(by == "source"), a.epoch, err)
	default:
		w.tracef("%s e%d completes the task (rev %d)", sideName(by == "source"), a.epoch, w.coord.rev)
	}
	w.noteClaims()
	return err
}

// reach says whether x's requests reach the coordinator now: nil, or
// errCoordDown (the coordinator down, or x's node cut off from it).
func (w *world) reach(x *holder) error {
	if w.coord.unreachable(w.tick, x.node) {
		return errCoordDown
	}
	return nil
}

// noteClaims marks the holder whose claim the coordinator deleted since
// the last call (an expiry, a reset, a revoke, a completion), for
// invariant (e)'s one window.
func (w *world) noteClaims() {
	var cur uint64
	if w.coord.claim != nil {
		cur = w.coord.claim.epoch
	}
	if prev := w.claimEpoch; prev != 0 && prev != cur {
		if a := w.attemptOf(prev); a != nil && a.x != nil && a.x.lostAt == 0 && a.x.holds {
			a.x.lostAt = w.tick
		}
	}
	w.claimEpoch = cur
}

// pause freezes a's holder for n ticks; its guard's first look after it
// wakes comes wakeCheck ticks later.
func (w *world) pause(a *attempt, n, wakeCheck uint64) {
	x := a.x
	x.pausedUntil = w.tick + n
	x.wakeCheck = min(wakeCheck, uint64(w.k.ClaimWindowTicks)-1)
	a.paused = true
	w.tracef("holder x%d (epoch %d) pauses for %d ticks, until tick %d; %s", x.id, x.epoch, n, x.pausedUntil, &w.coord)
}

// noteWrite records that a message of a's sending side was accepted by a
// running processor on the other side while its sender still ran: a write
// of a's attempt. Invariant (e): at each receiving node, accepted writes
// never go back in epoch, so once a newer claim's attempt has written
// there, an older holder's messages, whatever it believes, change
// nothing; and with the lease guard, at no tick do two holders that both
// believe they hold the claim both write.
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
		if w.k.LeaseGuard {
			w.violate("e", "holders x%d (epoch %d) and x%d (epoch %d) both believe they hold the claim and both wrote at this tick", b.x.id, b.epoch, a.x.id, a.epoch)
		}
		w.stats.DualWriteTicks++
		w.tracef("both wrote: holders x%d (epoch %d) and x%d (epoch %d) both believe they hold the claim; in epoch order at the %s node", b.x.id, b.epoch, a.x.id, a.epoch, sideName(toSrc))
	}
}

// checkHeld: a write of a (or a going live) while the coordinator no
// longer holds a's claim. With the lease guard that cannot happen once
// the claim's lease ran out (a holder stops as its guard no longer holds
// the claim certainly, half a TTL after its last keepalive answer, and
// nothing it sent stays in flight that long); without it, it is counted.
// A claim the supervisor deleted under a live holder (a reset, a revoke)
// is another matter: its holder learns within a window, and the epoch
// order is what protects the replicas meanwhile; that is counted too.
func (w *world) checkHeld(a *attempt, what string) {
	if a.x == nil || w.coord.holds(a.epoch) || !a.x.holds {
		return
	}
	if _, leased := w.coord.leases[a.epoch]; !leased && w.k.LeaseGuard {
		w.violate("e", "%s of epoch %d accepted after its claim's lease ran out (%s)", what, a.epoch, &w.coord)
	}
	w.stats.WritesAfterLoss++
}

// checkStopped: a holder that stopped writes nothing more (its source
// processor's Abort, sent as it stops, is not a write).
func (w *world) checkStopped(a *attempt, m wire.Message) {
	if a.x == nil || a.x.holds || a.src == nil || a.src.State() == recovery.StateDone {
		return
	}
	if _, ok := m.(*wire.Abort); ok {
		return
	}
	w.violate("e", "holder x%d stopped, but its source processor sent %s", a.x.id, m.Type())
}

// newerThanTaken reports whether a is newer than what taken holds of its
// task (supervise.Taken.Take's rule), without taking it.
func newerThanTaken(taken supervise.Taken, a supervise.Assignment) bool {
	h, ok := taken[a.Task]
	return !ok || a.Opened > h.Opened || a.Opened == h.Opened && a.Seq > h.Seq
}
