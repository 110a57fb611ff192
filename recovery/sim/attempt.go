package sim

import (
	"errors"
	"fmt"
	"strings"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// attempt is one attempt of the rejoin, with its own fencing epoch: a
// destination processor on a fresh replica that joined the feed when the
// destination took the attempt, a source processor on the source node's
// executor, and the connection between them. With claims the attempt is
// its holder's (holder.go): it claims the task on the source node, says
// hello to the destination, which checks the claim and starts its side,
// and its source processor starts on the destination's answer, as the
// node's do. Without claims (a script that does not ask for them) the
// destination side starts first and the source side srcUpAt.
type attempt struct {
	epoch uint64
	hdr   wire.MsgHeader
	// sn is the source node the attempt runs on.
	sn *srcReplica

	exec *partition.Executor   // the destination replica
	dst  *recovery.Destination // nil until the destination took the hello
	src  *recovery.Source      // nil until the source side is up
	// srcUpAt is when the source side starts, without claims.
	srcUpAt uint64
	// refusedLive: the destination refused its hello because its replica
	// is live already.
	refusedLive bool
	// helloErr: the attempt's source side ended before its processor
	// started (the destination refused the hello, or the holder stopped
	// first).
	helloErr error
	// closed: its holder stopped before its source processor started, and
	// closed the connection (stopHolder).
	closed bool
	// redialAt: the source's redial of its broken connection, asked by
	// its core, is answered then (0: none out).
	redialAt uint64
	// resumed counts the connections resumed.
	resumed int
	feed    []*feedLink // one per initiator, to exec
	s2d     *pipe
	d2s     *pipe

	// srcState and dstState are the states last seen, to trace moves and
	// run the checks that go with them once.
	srcState, dstState recovery.State

	// cut: the connection is gone. A side learns of it at srcLearnAt or
	// dstLearnAt (0: it never is told and must find out by its stall
	// timeout). ghost: until then its messages travel a late route that
	// may bring them to a newer attempt.
	cut                    bool
	srcLearnAt, dstLearnAt uint64
	ghost                  bool
	// dstGone: the destination node restarted; its processor and replica
	// are gone.
	dstGone bool
	// fault is the fault that hit this attempt; superseded says a node
	// ended one of its processors for a newer attempt.
	fault      *fault
	superseded bool

	// x is the holder of the attempt's claim (nil when the world runs
	// without claims: a script that does not ask for them). paused: a
	// pause fault froze it. claimLost: it stopped for that reason.
	x                 *holder
	paused, claimLost bool
	// replicaFailed: its source node's replica failed or was held
	// (registration.go, holds.go).
	// startTick: when it started.
	replicaFailed bool
	startTick     uint64
	// feedBreaks counts the breaks of feeds into the source node while
	// the attempt ran, and those still out when it began (feedbreak.go).
	// One gap stays under the stall window; two in a row may not, and the
	// source, waiting for an initiator's txns to reach its boundary,
	// times out.
	feedBreaks int
	// silenced: an initiator went silent while it ran, or was silent when
	// it started (silent.go): every replica holds until the fence, and
	// its processors may time out; one the destination heard nothing of
	// before it went silent leaves the handoff uncovered.
	silenced bool

	// handoff is the simulator's own record of the source at the moment
	// it sent Handoff; e is E once known.
	handoff *handoffRecord
	e       txnid.ID

	throttled      bool
	throttledTicks int64
}

// handoffRecord is what the source held when it sent Handoff, read by the
// simulator rather than taken from the message.
type handoffRecord struct {
	e          txnid.ID
	digest     uint64 // the source partition's running digest then
	recomputed uint64 // and the digest recomputed from every row
	rows       []int
}

func (a *attempt) srcStateString() string {
	if a.src == nil {
		return "not started"
	}
	return a.src.State().String()
}

func (a *attempt) dstStateString() string {
	switch {
	case a.dstGone:
		return "gone (node restarted)"
	case a.dst == nil:
		return "not started"
	}
	return a.dst.State().String()
}

// dstUp reports whether a's destination processor exists on a node that
// did not restart.
func (a *attempt) dstUp() bool { return a.dst != nil && !a.dstGone }

// dstEnded reports whether the attempt's destination side is over without
// going live.
func (a *attempt) dstEnded() bool {
	return a.dstGone || (a.dst == nil && a.helloErr != nil) || (a.dst != nil && a.dst.State() == recovery.StateAborted)
}

// sideName names a side of the rejoin in the trace.
func sideName(src bool) string {
	if src {
		return "src"
	}
	return "dst"
}

// cur is the newest attempt.
func (w *world) cur() *attempt {
	if len(w.atts) == 0 {
		return nil
	}
	return w.atts[len(w.atts)-1]
}

// srcAttempt is the newest attempt that started its source side, on any
// source node.
func (w *world) srcAttempt() *attempt {
	for i := len(w.atts) - 1; i >= 0; i-- {
		if w.atts[i].src != nil {
			return w.atts[i]
		}
	}
	return nil
}

// srcAttemptOn is the attempt whose source processor node sr runs now: the
// newest one there that started its source side.
func (w *world) srcAttemptOn(sr *srcReplica) *attempt {
	for i := len(w.atts) - 1; i >= 0; i-- {
		if a := w.atts[i]; a.src != nil && a.sn == sr {
			return a
		}
	}
	return nil
}

// dstAttempt is the attempt whose destination processor the destination
// node runs now.
func (w *world) dstAttempt() *attempt {
	for i := len(w.atts) - 1; i >= 0; i-- {
		if a := w.atts[i]; a.dstUp() {
			return a
		}
	}
	return nil
}

// ctrlDelayMax bounds how long a word of the coordinator takes to reach
// a node (the source node's poll of its assignments): well inside the
// destination's stall window.
func (w *world) ctrlDelayMax() int { return min(20, w.k.StallTicksMax/3) }

// startAttempt starts an attempt. With claims, x holds its claim: the
// source node says hello to the destination over the attempt's new
// connection, and the rest follows from the answer. Without, it is
// attempt epoch+1: a fresh destination replica joins the feed now, and
// the source side starts srcDelay ticks later.
func (w *world) startAttempt(sr *srcReplica, x *holder, srcDelay uint64) *attempt {
	// An attempt refused at its hello because the replica is live already
	// did no work: it is the source asking while the destination, live,
	// could not report its completion (coordinator out of its reach) and
	// the health task reset the task meanwhile. It restarts nothing, so
	// it does not count against the faults' bound.
	worked := 0
	for _, b := range w.atts {
		if !b.refusedLive {
			worked++
		}
	}
	bound := w.k.Faults + 1
	if w.regFired {
		// A lost registration ends at most the attempt on its node (its
		// claim lost, or its replica failed: no new claim there before
		// it settles), and its joiner, whose feed opens late, at most the
		// attempt whose E it came after (AbortUncovered).
		bound += 2
	}
	// A feed that breaks outside a lost registration fails at most the
	// replica on its node, which ends the attempt there.
	bound += w.feedBreaksFired
	// A silence ends at most the attempts that ran through it: the one
	// under way, and one started while it lasted.
	bound += 2 * w.stats.Silenced
	if !w.scripted && worked >= bound {
		w.violate("c", "attempt %d needed, but %d faults allow at most %d: %s", worked+1, w.k.Faults, bound, w.where())
	}
	a := &attempt{srcUpAt: w.tick + srcDelay, x: x, sn: sr, startTick: w.tick, silenced: w.silentNow()}
	// A feed into the source node out since before the attempt counts
	// as a break of its own: its gap and one in the attempt's time add
	// up past the stall window as two breaks within it do (seed
	// 1300001662: a 57-tick gap begun 10 ticks before the attempt, then
	// one of 35).
	for i := range sr.broke {
		if sr.broke[i] || sr.dialing[i] != nil {
			a.feedBreaks++
		}
	}
	if x != nil {
		a.epoch = x.epoch
	} else {
		w.epoch++
		a.epoch = w.epoch
	}
	a.hdr = wire.MsgHeader{Epoch: a.epoch, Partition: partitionID}
	a.s2d = &pipe{name: fmt.Sprintf("e%d src>dst", a.epoch), a: a, codec: w.k.Codec}
	a.d2s = &pipe{name: fmt.Sprintf("e%d dst>src", a.epoch), a: a, toSrc: true, codec: w.k.Codec}
	w.atts = append(w.atts, a)
	if x != nil {
		w.tracef("attempt %d: %s node says hello to the destination", a.epoch, sr.id)
		a.s2d.send(w, &wire.Hello{Kind: wire.HelloRejoin, Node: sr.id, Partition: partitionID, Epoch: a.epoch}, w.k.ConnDelayMax, 1)
		return a
	}
	w.startDest(a, a.sn.id)
	w.tracef("attempt %d: destination replica up, joins the feed; source side at tick %d", a.epoch, a.srcUpAt)
	if a.srcUpAt <= w.tick {
		w.startSource(a)
	}
	return a
}

// startDest starts a's destination side on the destination node's core:
// a fresh replica that joins the feed now (hearing the initiators whose
// feed to that node is open, as recovery/node's does), and its processor.
// A running attempt is superseded first, by the core.
func (w *world) startDest(a *attempt, peer string) {
	if err := w.dst.StartDestination(peer, w.k.destinationConfig(a.hdr, nil)); err != nil {
		w.violate("config", "destination: %v", err)
	}
	d := w.dst.Destination()
	a.exec, a.dst, a.dstState = w.dstExec, d, d.State()
	for range w.inits {
		a.feed = append(a.feed, &feedLink{to: a})
	}
}

// onHello is the destination node taking a rejoin hello (recovery/node's
// serveRejoin and checkHolder): the task's claim must stand, at the
// hello's epoch, held by the node that says hello, which the task's
// assignment must name as its source; then the node's replica
// core applies its fence (recovery.Replica.CheckDestination: not live, an
// epoch above every one it has seen). A newer attempt supersedes the one
// it runs, and the answer goes back ahead of the destination's first
// message. A refusal goes back as a Reply.
func (w *world) onHello(a *attempt, h *wire.Hello) {
	refuse := func(format string, args ...any) {
		why := fmt.Sprintf(format, args...)
		w.stats.HellosRefused++
		w.tracef("dst node refuses the hello of epoch %d: %s", h.Epoch, why)
		a.d2s.send(w, &wire.Reply{Err: why}, w.k.ConnDelayMax, 1)
	}
	hold, found, err := w.coord.holderOf(w.tick)
	switch {
	case err != nil:
		refuse("%v", err)
		return
	case !found:
		refuse("no claim on task %s: %s at epoch %d holds none", simTask, h.Node, h.Epoch)
		return
	case hold.Node != h.Node || hold.Epoch != h.Epoch:
		refuse("the claim on task %s is %q's at epoch %d, not %q's at %d", simTask, hold.Node, hold.Epoch, h.Node, h.Epoch)
		return
	case w.scripted && !w.auto:
		// A script without its supervisor plays the assignment's part:
		// its holder claims what a supervisor would have assigned it.
	case w.coord.assign == nil:
		refuse("the claim on task %s is %s's at epoch %d, but the supervisor assigned it to nobody: a claim outside the assignment", simTask, h.Node, h.Epoch)
		return
	case w.coord.assign.Source != h.Node:
		refuse("the claim on task %s is %s's at epoch %d, but the supervisor assigned it to %s: a claim outside the assignment", simTask, h.Node, h.Epoch, w.coord.assign.Source)
		return
	}
	resume, err := w.dst.CheckDestination(h.Node, h.Epoch)
	if err != nil {
		// Refused for being live only above the fence: a stale hello
		// is refused whatever the replica's state.
		a.refusedLive = w.dst.State() == recovery.ReplicaLive && h.Epoch > w.dst.Fence()
		refuse("%v", err)
		return
	}
	if resume {
		w.violate("c", "a second hello of epoch %d: the simulator's attempts say hello once", h.Epoch)
	}
	prev := w.dstAttempt()
	if prev != nil && prev.dst.State().Final() {
		prev = nil // nothing to supersede
	}
	if prev != nil {
		prev.superseded = true
		w.tracef("dst node: attempt %d superseded by %d", prev.epoch, a.epoch)
	}
	w.startDest(a, h.Node)
	if prev != nil {
		w.afterCall(prev)
	}
	w.tracef("attempt %d: destination checks the claim, replica up, joins the feed", a.epoch)
	a.d2s.send(w, &wire.Hello{Kind: wire.HelloRejoin, Node: dstNode, Partition: partitionID, Epoch: h.Epoch}, w.k.ConnDelayMax, 1)
	w.afterCall(a)
}

// onHelloAnswer is the source node reading the destination's answer: its
// attempt core starts the source processor, or, refused, ends the attempt
// before it.
func (w *world) onHelloAnswer(a *attempt, m wire.Message) {
	if a.closed {
		return // the connection was closed before the answer
	}
	x := a.x
	switch m := m.(type) {
	case *wire.Hello:
		x.h.Connected(int64(w.tick), nil)
	case *wire.Reply:
		a.helloErr = fmt.Errorf("hello refused: %s", m.Err)
		w.tracef("attempt %d: %v", a.epoch, a.helloErr)
		x.h.Connected(int64(w.tick), a.helloErr)
	default:
		w.violate("c", "attempt %d: %s before the hello's answer", a.epoch, m.Type())
		return
	}
	w.holdDo(x)
}

// startSource starts the source side of a on the source node's executor,
// or says why not. One source processor runs there at a time: an older
// one still running (frozen, or it has not learned that its attempt is
// over) is superseded first, and must then have released the executor.
func (w *world) startSource(a *attempt) error {
	if prev := w.srcAttemptOn(a.sn); prev != nil && !prev.src.State().Final() {
		prev.superseded = true
		w.tracef("%s node: attempt %d superseded by %d", a.sn.id, prev.epoch, a.epoch)
		a.sn.core.AbortSource(prev.epoch, wire.AbortStaleEpoch, fmt.Sprintf("superseded by attempt %d", a.epoch))
		w.afterCall(prev)
	}
	w.checkReleased(a.sn, fmt.Sprintf("before attempt %d's source starts", a.epoch))
	if err := a.sn.core.StartSource(dstNode, w.k.sourceConfig(a.hdr)); err != nil {
		if (a.sn.failed || a.sn.held) && errors.Is(err, recovery.ErrReplica) {
			// Its replica failed or was held between the hello and its
			// answer (registration.go): the node ends the attempt, its core
			// asking the close (a script's attempt without a holder
			// closes at once).
			w.tracef("attempt %d: source refused: %v", a.epoch, err)
			if a.x == nil {
				w.closeBeforeSource(a, err)
			}
			return err
		}
		w.violate("config", "source: %v", err)
		return err
	}
	s := a.sn.core.Source()
	a.src, a.srcState = s, s.State()
	w.tracef("attempt %d: source up (%s)", a.epoch, s.State())
	w.afterCall(a)
	return nil
}

// afterCall follows every call into a's processors: it sends what they
// put in their outboxes and runs the checks that go with a change of
// state.
func (w *world) afterCall(a *attempt) {
	if a.src != nil {
		w.drain(a.sn.core, a.sn.id)
		w.noteState(a, true)
	}
	if a.dst != nil && !a.dstGone {
		w.drain(w.dst, dstNode)
		w.noteState(a, false)
	}
}

// drain does what a node's replica core produced, as recovery/node's
// drain does: the messages go onto their attempt's connection, and each
// attempt's moves run their checks. The initiators' replies are not
// modelled.
func (w *world) drain(core *recovery.Replica, node string) {
	for {
		outs := core.Outbox()
		if len(outs) == 0 {
			return
		}
		for _, o := range outs {
			switch o.Kind {
			case recovery.OutFailed, recovery.OutHeld:
				continue // a source node's replica failed or held (failSource, loseSource)
			case recovery.OutLossAccepted:
				// Only an admin's accept-loss makes a held replica live,
				// and the run has none.
				w.violate("f", "%s node's replica accepted a loss no one accepted", node)
			}
			a := w.attemptOf(o.Epoch)
			src := o.Kind == recovery.OutSourceMessages || o.Kind == recovery.OutSourceEnded
			if a == nil || (src && a.src == nil) || (!src && a.dst == nil) {
				w.violate("c", "%s node's replica produced %v for attempt %d, which it does not run", node, o.Kind, o.Epoch)
			}
			switch o.Kind {
			case recovery.OutSourceMessages:
				w.sendSource(a, o)
			case recovery.OutDestinationMessages:
				for _, m := range o.Msgs {
					w.route(a, false, m)
				}
			}
			w.noteState(a, src)
		}
	}
}

// sendSource routes a source's messages.
func (w *world) sendSource(a *attempt, o recovery.Output) {
	if x := a.x; x != nil && w.k.LeaseGuard && !o.State.Final() && !x.guard.Held(int64(w.tick)) && w.opts.Sabotage != SabotageIgnoreClaimLoss {
		// The lease guard, as the node's sendSource: a claim that may
		// have expired sends nothing more, whatever the holder believes.
		w.stopHolder(a, wire.AbortClaimLost, fmt.Sprintf("claim of epoch %d not certainly held since tick %d", x.epoch, x.guard.HeldUntil()))
		return
	}
	for _, m := range o.Msgs {
		w.route(a, true, m)
	}
}

// noteState runs the checks of a's source's (src) or destination's move
// since the last look, if it moved.
func (w *world) noteState(a *attempt, src bool) {
	if src {
		if st := a.src.State(); st != a.srcState {
			from := a.srcState
			a.srcState = st
			w.onSourceState(a, from, st)
		}
		return
	}
	if st := a.dst.State(); st != a.dstState {
		from := a.dstState
		a.dstState = st
		w.onDestinationState(a, from, st)
	}
}

// toProcessor hands m to a's source (toSrc) or destination processor:
// through its node's replica core while it runs there (a destination gone
// live included), else to the ended processor itself, which refuses
// everything (counting a stale epoch) and does nothing.
func (w *world) toProcessor(a *attempt, toSrc bool, m wire.Message) error {
	switch {
	case toSrc && a.sn.core.Source() == a.src:
		return a.sn.core.OnSourceMessage(a.epoch, m)
	case toSrc:
		return a.src.OnMessage(m)
	case !a.dstGone && w.dst.Destination() == a.dst:
		return w.dst.OnDestinationMessage(a.epoch, m)
	}
	return a.dst.OnMessage(m)
}

// route sends a message a processor put in its outbox: over the
// attempt's connection, or, once that is cut, over the late route or
// nowhere.
func (w *world) route(a *attempt, fromSrc bool, m wire.Message) {
	if h, ok := m.(*wire.Handoff); ok && fromSrc {
		if a.handoff != nil && a.resumed > 0 {
			// Sent again on a resumed connection (Source.Resume): the
			// same boundary and digest as when first sent.
			if h.TxnID != a.handoff.e || h.Digest != a.handoff.digest {
				w.violate("a", "source re-sent handoff at E=%v digest %016x, first sent at E=%v digest %016x", h.TxnID, h.Digest, a.handoff.e, a.handoff.digest)
			}
		} else {
			w.recordHandoff(a, h)
		}
	}
	if _, hb := m.(*wire.Heartbeat); !hb && w.tr.on {
		w.tracef("%s > %s", sideName(fromSrc), w.describe(m))
	}
	if w.lose[m.Type()] {
		delete(w.lose, m.Type())
		w.tracef("lost on the way: %s", w.describe(m))
		return
	}
	if fromSrc {
		w.checkStopped(a, m)
	}
	switch {
	case !a.cut && w.claims && w.replaced(a, fromSrc):
		// The receiving node runs a newer attempt's processor now: the
		// message reaches it, which must reject it by its epoch.
		p := w.ghostSrc
		if fromSrc {
			p = w.ghostDst
		}
		p.send(w, m, w.k.ConnDelayMax, 1)
	case !a.cut:
		p := a.d2s
		if fromSrc {
			p = a.s2d
		}
		p.send(w, m, w.k.ConnDelayMax, 1)
	case a.ghost:
		p := w.ghostSrc
		if fromSrc {
			p = w.ghostDst
		}
		p.send(w, m, w.k.GhostDelayMax, 1)
	}
}

// replaced reports whether the node a message of a goes to (the
// destination node if fromSrc, else the source node) has replaced a's
// processor by a newer attempt's: with claims, a node runs one processor
// per partition and side, and hands every message to it.
func (w *world) replaced(a *attempt, fromSrc bool) bool {
	var b *attempt
	if fromSrc {
		b = w.dstAttempt()
	} else {
		b = w.srcAttempt()
	}
	return b != nil && b.epoch > a.epoch
}

// onConn delivers a message from a's connection to a's processor on the
// receiving side (which may have ended: it then refuses it).
func (w *world) onConn(p *pipe, m wire.Message) {
	a := p.a
	switch {
	case !p.toSrc && a.dst == nil:
		if h, ok := m.(*wire.Hello); ok {
			w.onHello(a, h)
		}
		return
	case p.toSrc && a.sn.dead:
		return // its node is gone
	case p.toSrc && a.src == nil:
		w.onHelloAnswer(a, m)
		return
	}
	if b := w.newerAt(p.toSrc, a); b != nil && w.claims {
		// The receiving node runs a newer attempt's processor now: the
		// message reaches it, which must reject it by its epoch.
		w.onStale(p.toSrc, b, m)
		return
	}
	var err error
	var running, senderRunning bool
	side := sideName(p.toSrc)
	if p.toSrc {
		running, senderRunning = !a.src.State().Final(), !a.dstGone && !a.dst.State().Final()
		err = w.toProcessor(a, true, m)
	} else {
		running, senderRunning = !a.dst.State().Final(), !a.src.State().Final()
		err = w.toProcessor(a, false, m)
	}
	if err == nil && running && senderRunning {
		w.noteWrite(a, p.toSrc, m)
	}
	if _, hb := m.(*wire.Heartbeat); w.tr.on && (!hb || err != nil) {
		if err != nil {
			w.tracef("%s < %s: %v", side, w.describe(m), err)
		} else {
			w.tracef("%s < %s", side, w.describe(m))
		}
	}
	w.afterCall(a)
}

// newerAt returns the attempt whose processor the receiving node runs
// now, if it is newer than a's: with claims, a node runs one processor per
// partition and side, and hands every message to it.
func (w *world) newerAt(toSrc bool, a *attempt) *attempt {
	var b *attempt
	if toSrc {
		b = w.srcAttemptOn(a.sn)
	} else {
		b = w.dstAttempt()
	}
	if b == nil || b.epoch <= a.epoch {
		return nil
	}
	return b
}

// onGhost delivers a late message of a cut attempt to the processor the
// receiving node runs now. Only a newer attempt's processor gets it (the
// same attempt's connection is gone), and it must reject it by its epoch:
// a message of a superseded epoch that a running processor does not
// reject breaks invariant (d).
func (w *world) onGhost(p *pipe, m wire.Message) {
	e := m.Header().Epoch
	var a *attempt
	if p.toSrc {
		// To the source node of the message's attempt, if it lives.
		if old := w.attemptOf(e); old != nil && !old.sn.dead {
			a = w.srcAttemptOn(old.sn)
		}
	} else {
		a = w.dstAttempt()
	}
	if a == nil || a.epoch <= e {
		// Its own attempt's connection is gone, and no newer attempt runs.
		w.stats.GhostDropped++
		if w.tr.on {
			w.tracef("late %s < %s: dropped, no newer attempt", sideName(p.toSrc), w.describe(m))
		}
		return
	}
	w.onStale(p.toSrc, a, m)
}

// onStale hands a message of a superseded epoch to a's processor, which
// must reject it by its epoch if it runs (invariant d).
func (w *world) onStale(toSrc bool, a *attempt, m wire.Message) {
	e := m.Header().Epoch
	w.stats.StaleDelivered++
	old := w.attemptOf(e)
	var err error
	var st recovery.State
	side := sideName(toSrc)
	if toSrc {
		st = a.src.State()
		err = w.toProcessor(a, true, m)
	} else {
		st = a.dst.State()
		err = w.toProcessor(a, false, m)
	}
	if !st.Final() {
		w.stats.StaleToRunning++
		if old != nil && old.paused {
			// A late message of a paused holder's attempt.
			w.stats.PausedLate++
			if errors.Is(err, recovery.ErrStaleEpoch) {
				w.stats.PausedRejected++
			}
		}
	}
	w.tracef("late %s < %s to attempt %d (%s): %v", side, w.describe(m), a.epoch, st, err)
	if !st.Final() && !errors.Is(err, recovery.ErrStaleEpoch) {
		w.stats.StaleAccepted++
		w.violate("d", "%s of attempt %d (%s) accepted %s of superseded epoch %d: err=%v", side, a.epoch, st, m.Type(), e, err)
	}
	w.afterCall(a)
}

// learnCuts tells each side of a cut connection, at its tick, that the
// connection is gone: it aborts its attempt.
func (w *world) learnCuts() {
	for _, a := range w.atts {
		if !a.cut {
			continue
		}
		if a.srcLearnAt != 0 && w.tick >= a.srcLearnAt && !w.pausedNow(a) {
			a.srcLearnAt = 0
			if a.src == nil && a.helloErr == nil && !a.closed {
				a.helloErr = errors.New("connection lost before the hello's answer")
				if a.x != nil {
					a.x.h.Connected(int64(w.tick), a.helloErr)
					w.holdDo(a.x)
				}
			}
			if a.src != nil && !a.src.State().Final() && w.scripted {
				// A script's cut ends the attempt where each side learns
				// of it: its scenarios walk the aborts, one step at a
				// time.
				w.tracef("src e%d learns the connection is cut", a.epoch)
				a.sn.core.AbortSource(a.epoch, wire.AbortConnLost, "connection lost")
				w.afterCall(a)
			} else if a.src != nil && !a.src.State().Final() && a.x != nil {
				// The attempt core redials a broken connection for the
				// grace, and resumes the attempt if the destination
				// still runs it (redials).
				w.tracef("src e%d learns the connection is cut; it redials", a.epoch)
				a.x.h.Broke(int64(w.tick))
				w.holdDo(a.x)
			}
		}
		if a.dstLearnAt != 0 && w.tick >= a.dstLearnAt {
			a.dstLearnAt = 0
			if a.dstUp() && !a.dst.State().Final() && w.scripted {
				w.tracef("dst e%d learns the connection is cut", a.epoch)
				w.dst.AbortDestination(a.epoch, wire.AbortConnLost, "connection lost")
				w.afterCall(a)
			} else if a.dstUp() && !a.dst.State().Final() {
				// recovery/node's destination keeps its attempt when its
				// connection ends: a redial resumes it, or its stall
				// window ends it.
				w.tracef("dst e%d learns the connection is cut; it waits for a resume", a.epoch)
			}
		}
	}
	w.redials()
}

// redialLater schedules a's source's next dial a few ticks from now.
func (w *world) redialLater(a *attempt) {
	a.redialAt = w.tick + 1 + uint64(w.net.IntN(4))
}

// closeBeforeSource ends a's source side before its processor started,
// for err: the node closes the attempt's connection, as recovery/node's
// source side does, and the destination learns of it as of a cut
// (nothing in flight arrives).
func (w *world) closeBeforeSource(a *attempt, err error) {
	a.helloErr, a.closed = err, true
	w.cut(a, 1, 1+w.k.ConnDelayMax, false)
}

// redials moves the attempt core of every source whose connection broke
// on by a tick (its grace, its hold: recovery.Source.HoldsPartition), and
// answers the redials due: within the grace, a dial that finds the
// destination running the same attempt resumes it on a new connection
// (CheckDestination, then both processors' Resume: the destination drops
// what it has, the source sends again what may have been lost); one that
// finds it gone or ended fails, and the core asks another.
func (w *world) redials() {
	for _, a := range w.atts {
		x := a.x
		if x == nil || x.dead || a.sn.dead {
			continue
		}
		if x.h.Broken() {
			holds := a.src != nil && !a.src.State().Final() && a.src.HoldsPartition()
			x.h.Tick(int64(w.tick), holds)
			if !x.h.Broken() {
				a.redialAt = 0
			}
			w.holdDo(x)
		}
		if a.redialAt == 0 || w.tick < a.redialAt || w.pausedNow(a) {
			continue
		}
		a.redialAt = 0
		var refused error
		if !x.h.Broken() || !a.dstUp() || w.dst.Destination() != a.dst || a.dst.State().Final() {
			refused = errors.New("the destination runs no such attempt")
		} else if resume, err := w.dst.CheckDestination(a.sn.id, a.epoch); err != nil {
			refused = err
		} else if !resume {
			refused = errors.New("the destination would start the attempt anew")
		}
		if refused != nil {
			x.h.Connected(int64(w.tick), refused)
			w.holdDo(x)
			continue
		}
		a.resumed++
		w.stats.Resumed++
		a.cut, a.srcLearnAt, a.dstLearnAt = false, 0, 0
		a.s2d = &pipe{name: fmt.Sprintf("e%d src>dst #%d", a.epoch, a.resumed), a: a, codec: w.k.Codec}
		a.d2s = &pipe{name: fmt.Sprintf("e%d dst>src #%d", a.epoch, a.resumed), a: a, toSrc: true, codec: w.k.Codec}
		w.tracef("attempt %d: the source redialled; both sides resume on a new connection", a.epoch)
		if err := w.dst.ResumeDestination(a.epoch); err != nil {
			w.violate("c", "attempt %d: destination refused a resume it accepted at the hello: %v", a.epoch, err)
		}
		x.h.Connected(int64(w.tick), nil)
		w.holdDo(x)
	}
}

// cut cuts a's connection: everything in flight is lost, and each side
// learns of it after its delay (0: never told).
func (w *world) cut(a *attempt, srcLearn, dstLearn int, ghost bool) {
	a.cut, a.ghost = true, ghost
	lost := a.s2d.lose() + a.d2s.lose()
	if srcLearn > 0 {
		a.srcLearnAt = w.tick + uint64(srcLearn)
	} else {
		w.stats.CutsUnnoticed++
	}
	if a.dstUp() {
		if dstLearn > 0 {
			a.dstLearnAt = w.tick + uint64(dstLearn)
		} else {
			w.stats.CutsUnnoticed++
		}
	}
	w.tracef("attempt %d: connection cut, %d packets lost; source learns in %d, destination in %d (0: never), late route %v", a.epoch, lost, srcLearn, dstLearn, ghost)
}

// onSourceState runs on every move of a source processor.
func (w *world) onSourceState(a *attempt, from, to recovery.State) {
	switch to {
	case recovery.StateAborted:
		w.tracef("src e%d %s -> aborted: %v", a.epoch, from, a.src.Err())
		w.checkAbort(a, "source", a.src.Err())
	default:
		if from == recovery.StateAnswering {
			w.tracef("src e%d %s -> %s (S=%v)", a.epoch, from, to, a.src.Boundary())
		} else {
			w.tracef("src e%d %s -> %s", a.epoch, from, to)
		}
	}
	if to.Final() {
		w.checkLogBound(a)
		w.checkReleased(a.sn, fmt.Sprintf("after attempt %d's source ended %s", a.epoch, to))
	}
}

// onDestinationState runs on every move of a destination processor.
func (w *world) onDestinationState(a *attempt, from, to recovery.State) {
	switch to {
	case recovery.StateAborted:
		w.tracef("dst e%d %s -> aborted: %v", a.epoch, from, a.dst.Err())
		w.checkAbort(a, "destination", a.dst.Err())
		w.checkEmpty(a)
		a.feed = nil // the replica leaves the feed
	case recovery.StateLive:
		w.tracef("dst e%d %s -> live at E=%v", a.epoch, from, a.e)
		if w.live != nil {
			w.violate("e", "destination of attempt %d live after attempt %d's: the node runs one processor", a.epoch, w.live.epoch)
		}
		w.checkHeld(a, "going live")
		w.checkLive(a)
		if w.claims {
			// The destination completes the task too (DESIGN.md step 9);
			// the source's completion, by the HandoffAck, is then a
			// duplicate, or the other way round.
			w.completeTask(a, claim.Attempt{Task: simTask, Executor: dstNode + ":destination", Epoch: a.epoch}, "destination")
		}
	default:
		w.tracef("dst e%d %s -> %s", a.epoch, from, to)
	}
}

// checkAbort fails the run if an attempt aborted for a reason nothing in
// the run explains. The faults explain their own reasons (and a cut or a
// restart a timeout, when a side is left to notice by itself); the
// supervisor explains a superseded source. Anything else (a digest
// mismatch, a protocol or decode error, an internal error, an overload, or
// a timeout with no fault) is a bug.
func (w *world) checkAbort(a *attempt, side string, err error) {
	var ae *recovery.AbortError
	if !errors.As(err, &ae) {
		w.violate("c", "%s of attempt %d aborted without an AbortError: %v", side, a.epoch, err)
	}
	ok := false
	switch ae.Reason {
	case wire.AbortStaleEpoch:
		ok = a.superseded
	case wire.AbortShutdown, wire.AbortClaimLost, wire.AbortNodeFailed:
		ok = a.fault != nil && a.fault.reason == ae.Reason && a.fault.kind != faultPause && a.fault.kind != faultOutage
		// A holder stops when its guard counts its claim lost.
		ok = ok || (ae.Reason == wire.AbortClaimLost && a.claimLost)
		// A source node's replica failed or was held (registration.go,
		// holds.go).
		ok = ok || (ae.Reason == wire.AbortShutdown && a.replicaFailed)
	case wire.AbortUncovered:
		// A new initiator process joined after E was chosen
		// (registration.go): the destination cannot show it has all of
		// its txns at or above E (docs/DESIGN.md "Feeds that open late").
		// With joins, the destination tracks it from its join of the
		// partition there, at its first txn, which may come long after
		// it registered (seed 3018373).
		ok = w.joiner != nil && w.joiner.active && a.startTick <= max(w.joiner.joinTick, w.joiner.dstJoinTick)
		ok = ok || a.silenced
		// A fenced initiator's last txns may still be queued at the
		// source, above E, behind another initiator's clock: the source
		// runs them after E, and a destination that never heard it (its
		// attempt began after the fence) cannot hold them. The next
		// attempt finds them run (seed 9008090).
		for _, in := range w.inits {
			ok = ok || in.fenced && strings.Contains(ae.Text, fmt.Sprintf("initiator %d ", in.id))
		}
	case wire.AbortConnLost:
		// A node restart or death drops the connection as a cut does.
		ok = a.fault != nil && (a.fault.kind == faultCut || a.fault.kind == faultRestart || a.fault.kind == faultSourceDies)
		ok = ok || a.closed
	case wire.AbortTimeout:
		// A paused holder's source is silent: its destination times out;
		// so is a dead source, or one whose holder waits out an outage.
		ok = a.fault != nil && (a.fault.kind == faultCut || a.fault.kind == faultRestart || a.fault.kind == faultPause || a.fault.kind == faultOutage || a.fault.kind == faultSourceDies)
		// Its holder stopped before its source started and closed the
		// connection: the destination waits out its stall window.
		ok = ok || a.closed
		// Feeds into the source node broke more than once: their gaps
		// add up past the stall window (seed 934334737).
		ok = ok || a.feedBreaks >= 2
		// An initiator silent until its fence holds every replica.
		ok = ok || a.silenced
	}
	// A script aborts attempts as it pleases and reads the reasons in
	// its output.
	if !ok && !w.scripted {
		w.violate("c", "%s of attempt %d aborted with no fault to explain it: %v", side, a.epoch, err)
	}
}

// recordHandoff records, independently of the message, the source's
// content at the moment it sends Handoff, and checks that E is a txn
// boundary there: every txn below E executed, none at or above it, and
// nothing below it still to come.
func (w *world) recordHandoff(a *attempt, h *wire.Handoff) {
	src := a.sn.exec
	p := src.Partition()
	a.e = h.TxnID
	a.handoff = &handoffRecord{e: h.TxnID, digest: p.Digest(), recomputed: recompute(p), rows: rowCounts(p)}
	last := src.LastExecuted()
	if last >= h.TxnID {
		w.violate("a", "source sent handoff at E=%v having executed %v", h.TxnID, last)
	}
	if q, ok := src.QueuedFrom(0); ok && q < h.TxnID {
		w.violate("a", "source sent handoff at E=%v with txn %v below it still queued", h.TxnID, q)
	}
	if safe, ok := src.Safe(); !ok || safe+1 < h.TxnID {
		w.violate("a", "source sent handoff at E=%v with the safe txn ID at %v: a txn below E may still come", h.TxnID, safe)
	}
	if h.Digest != a.handoff.digest || a.handoff.digest != a.handoff.recomputed {
		w.violate("a", "handoff at E=%v: message digest %016x, source partition %016x, recomputed %016x", h.TxnID, h.Digest, a.handoff.digest, a.handoff.recomputed)
	}
	w.tracef("src e%d handoff at E=%v: %s", a.epoch, h.TxnID, w.describeReplica(src))
}
