package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// A source node that loses its registration while its process runs on
// (docs/DESIGN.md "Without the coordinator"; recovery/node's
// registration.go): it is cut off from the coordinator, its replica and
// its feeds go on, its registration's lease lapses or not, the
// initiators' feeds to it may break, and a new initiator process may
// register meanwhile and write without a feed to it. When it is back it
// registers again (a new record if the old one lapsed) and settles what
// its replica missed by recovery.Settle, the node's own rule; until then
// it takes no claim (the node's settledTerm gate) and its replica is not
// compared with the oracle. A replica Settle fails is out of the run (it
// needs a rejoin the run does not model); one it keeps must equal the
// oracle at every common txn from then on (invariant a).
//
// The initiators are nodes of their own whose records the coordinator
// does not keep (the run's nodes with replicas run none), each on one
// process for the run; the settlement's membership is theirs, and its
// history the registrations the coordinator recorded (the new process's,
// the lost node's own).

// regLossOneIn: one run in this many (of those with two sources) has a
// source node lose its registration.
const regLossOneIn = 4

// missedWaitTicks bounds the settlement's wait for a node's feed (the
// node's missedWait).
const missedWaitTicks = 150

// regLossPlan is a run's lost registration, drawn at setup from its own
// stream, so the other streams draw as they did without it.
type regLossPlan struct {
	on bool
	// node is the source node's index; at the earliest tick it fires (it
	// waits while a source is dead, failed or unsettled, or the
	// coordinator is down).
	node int
	at   uint64
	// afterLive: it waits, past at, for the destination to be live too,
	// so that it hits a replica that only executes, not a rejoin.
	afterLive bool
	// out is how long the node stays cut off; lapse: long enough for its
	// lease to run out.
	out   uint64
	lapse bool
	// breaks: per initiator, the tick of the outage (1-based) at which its
	// feed to the node breaks; 0: it stays open. redial: a script's ticks
	// from the break until the node is in reach (a run draws them).
	breaks []uint64
	redial uint64
	// joiner: a new initiator process registers joinAfter ticks into the
	// lapse and writes without a feed to the node; its feed there opens
	// joinerFeed ticks after the node is back (past missedWaitTicks now
	// and then: the node cannot learn what it missed, and fails its
	// replica). joinerSeed seeds its workload.
	joiner                bool
	joinAfter, joinerFeed uint64
	joinerSeed            uint64
	// alone: in a run where a source node dies, the loss waits for the
	// death, for the dead node's record to go and for the destination not
	// to be live, and hits the other source node: its replica is the
	// partition's only live one (recovery.Settle's rule 6).
	alone bool
}

// planRegLoss draws the run's lost registration from r: the same number
// of draws whatever they give.
func (w *world) planRegLoss(r *rand.Rand) {
	p := &w.regPlan
	p.on = r.IntN(regLossOneIn) == 0 && w.k.Sources == 2
	p.node = r.IntN(2)
	p.at = uint64(w.k.StartTick + r.IntN(max(1, w.k.WorkloadTicks)))
	p.lapse = r.IntN(3) != 0
	lease := w.regTTL()
	short := 1 + uint64(r.IntN(int(lease)-1))
	long := lease + uint64(w.k.ClaimWindowTicks) + 1 + uint64(r.IntN(3*int(lease)+50))
	p.out = short
	if p.lapse {
		p.out = long
	}
	p.breaks = make([]uint64, w.k.Initiators)
	for i := range p.breaks {
		if r.IntN(8) == 0 {
			p.breaks[i] = 1 + uint64(r.IntN(int(p.out)))
		}
	}
	p.joiner = p.lapse && r.IntN(2) == 0
	p.joinAfter = 1 + uint64(r.IntN(20))
	p.joinerFeed = uint64(r.IntN(missedWaitTicks / 2))
	if r.IntN(5) == 0 {
		p.joinerFeed = missedWaitTicks + uint64(r.IntN(50))
	}
	p.joinerSeed = r.Uint64()
	p.afterLive = r.IntN(2) == 0
	p.alone = p.lapse && r.IntN(2) == 0
}

// regTTL is a node registration's lease: half the claim's, as a dead
// source's (sourceDies); at least 2 ticks.
func (w *world) regTTL() uint64 { return uint64(max(2, w.k.ClaimTTLTicks/2)) }

// regLoss is a source node's lost registration, from the loss until it
// is settled.
type regLoss struct {
	// from is the tick of the loss, until the tick it is back in reach;
	// rev the revision the node was last registered at.
	from, until uint64
	rev         uint64
	// before are its feeds in at the loss; connsFrom world.conns then:
	// the hellos of feeds numbered above it came since.
	before    []recovery.SettleFeed
	connsFrom uint64
	// lapsed: its record went with its lease; back: registered again;
	// waits: when the settlement began waiting for each node's feed.
	lapsed, back bool
	waits        map[string]uint64
	expired      map[string]bool
	// others: the other nodes whose replica may have been live at some
	// tick from the loss until the node registers again: its record live
	// while its node had a record, as supervise.ReplicasBetween reads etcd's
	// history (recovery.SettleInput.Others); lastLive the revision each
	// of them was last seen live at, for the processes registered
	// meanwhile (recovery.SettleProcess.Others).
	others   []string
	lastLive map[string]uint64
}

// initiatorNode names initiator in's node, whose one process has
// incarnation 1.
func initiatorNode(in *initiator) string { return fmt.Sprintf("i%d", in.id) }

// maybeLoseRegistration fires the planned loss when its time has come and
// the run can take it: every source alive, settled and fed whole (no feed
// broken), the coordinator up, the workload still running.
func (w *world) maybeLoseRegistration() {
	p := &w.regPlan
	if !p.on || w.regFired || w.tick < p.at || w.quiescing || w.coord.down(w.tick) {
		return
	}
	alone := p.alone && (slices.ContainsFunc(w.faults, func(f *fault) bool { return f.kind == faultSourceDies }) ||
		slices.ContainsFunc(w.srcs, func(sr *srcReplica) bool { return sr.dead }))
	if p.afterLive && !alone && w.live == nil {
		return
	}
	sr := w.srcs[p.node]
	if alone {
		// The survivor of the planned death, once that death came, its
		// node's record went, and no destination is live.
		var dead *srcReplica
		for i, o := range w.srcs {
			if o.dead {
				dead = o
			} else {
				sr = o
				p.node = i
			}
		}
		if dead == nil || w.live != nil {
			return
		}
		if _, recorded := w.coord.nodes[dead.id]; recorded {
			return
		}
		if sr.failed || sr.loss != nil || sr.breaking() {
			return
		}
		w.stats.RegLossesAlone++
	} else {
		for _, sr := range w.srcs {
			if sr.dead || sr.failed || sr.loss != nil || sr.breaking() {
				return
			}
		}
	}
	w.regFired = true
	sr.loss = &regLoss{from: w.tick, until: w.tick + p.out, rev: w.coord.rev, waits: map[string]uint64{}, expired: map[string]bool{}}
	sr.loss.before, sr.loss.connsFrom = w.feedsInto(sr), w.conns
	w.coord.cut(w.tick, p.out, sr.id)
	w.coord.nodeDies(w.tick, w.regTTL(), sr.id) // its lease is not kept alive
	w.stats.RegLosses++
	w.tracef("%s node: registration lost (cut off from the coordinator for %d ticks, lease %d ticks); its replica and feeds go on", sr.id, p.out, w.regTTL())
}

// feedsInto describes the feeds open into sr for recovery.Settle.
func (w *world) feedsInto(sr *srcReplica) []recovery.SettleFeed {
	var out []recovery.SettleFeed
	for _, in := range w.inits {
		if in.core.Fed(sr.id) {
			out = append(out, recovery.SettleFeed{Node: initiatorNode(in), Inc: 1, Conn: sr.conns[in.idx]})
		}
	}
	return out
}

// stepRegLoss is a tick of the lost registration: feeds break, the lease
// lapses, a new process joins, the node comes back and settles.
func (w *world) stepRegLoss() {
	w.maybeLoseRegistration()
	p := &w.regPlan
	for _, sr := range w.srcs {
		l := sr.loss
		if l == nil || sr.dead {
			continue
		}
		for i, in := range w.inits {
			if i < len(p.breaks) && p.breaks[i] != 0 && w.tick == l.from+p.breaks[i] && in.core.Fed(sr.id) {
				gap := p.redial
				if !w.scripted {
					gap = w.feedGap()
				}
				w.breakFeed(in, sr, gap)
			}
		}
		if !l.back {
			w.noteOthersLive(sr)
		}
		if _, ok := w.coord.nodes[sr.id]; !ok && !l.lapsed {
			l.lapsed = true
			w.stats.RegLapses++
			w.tracef("%s node: registration lapsed (rev %d): the initiators take it for dead", sr.id, w.coord.rev)
			w.setInView(sr.id, false)
			w.redial()
		}
		if j := w.joiner; j != nil && !j.active && l.lapsed && !l.back && w.tick >= l.from+w.regTTL()+p.joinAfter {
			w.join(j, sr)
		}
		if !l.back && w.tick >= l.until && !w.coord.unreachable(w.tick, sr.id) {
			w.registerAgain(sr)
		}
		if l.back {
			w.settle(sr)
		}
	}
	if w.viewDirty {
		w.viewDirty = false
		w.redial()
	}
	if j := w.joiner; j != nil && j.active {
		lost := w.srcs[p.node].id
		if j.openAt != 0 && w.tick >= j.openAt {
			j.opened[lost] = true
		}
		if !j.core.Fed(lost) {
			w.dial(j) // its dial to the lost node fails until it may open
		}
	}
}

// join registers the new initiator process j while sr is away: the
// coordinator's history records it, and its view (sr dead) opens its
// feeds to every other node.
func (w *world) join(j *initiator, sr *srcReplica) {
	j.active, j.joinTick = true, w.tick
	rev := w.coord.write()
	w.coord.history = append(w.coord.history, registration{node: initiatorNode(j), inc: 1, rev: rev, initiator: true})
	for _, n := range append([]string{dstNode}, w.coord.order...) {
		if n != sr.id {
			j.opened[n] = true
		}
	}
	w.stats.Joiners++
	w.tracef("i%d: a new initiator process registers (rev %d); %s is not in its view", j.id, rev, sr.id)
	w.dial(j)
}

// registerAgain is sr registering once it reaches the coordinator again:
// its record still stands on its lease (the term resumes), or it writes
// a new one, which the initiators' views then hold.
func (w *world) registerAgain(sr *srcReplica) {
	l := sr.loss
	l.back = true
	delete(w.coord.nodeGoneAt, sr.id)
	if !l.lapsed {
		w.tracef("%s node: registered again on its lease", sr.id)
		return
	}
	now := timeAt(w.tick)
	rev := w.coord.write()
	w.coord.nodes[sr.id] = supervise.NodeRecord{ID: sr.id, Address: sr.id, Started: timeAt(0), LastActive: now, Status: supervise.NodeReady, Created: int64(rev)}
	w.coord.history = append(w.coord.history, registration{node: sr.id, inc: 1, rev: rev})
	w.setInView(sr.id, true)
	w.tracef("%s node: registered again on a new record (rev %d)", sr.id, rev)
	if j := w.joiner; j != nil && j.active {
		j.openAt = w.tick + w.regPlan.joinerFeed + 1
	}
	w.redial()
}

// redial gives every active initiator the view again; a silent one's
// process reads nothing.
func (w *world) redial() {
	for _, in := range w.inits {
		if (!in.joiner || in.active) && !in.silent {
			w.dial(in)
		}
	}
}

// settle is sr's settlement, each tick until it decides (recovery.Settle,
// with the node's bounded wait).
func (w *world) settle(sr *srcReplica) {
	l := sr.loss
	in := &recovery.SettleInput{
		Lapsed:     l.lapsed,
		Before:     l.before,
		Now:        w.feedsInto(sr),
		Alive:      map[string]uint64{},
		Told:       map[string]map[uint64]recovery.SettleTold{},
		Expired:    l.expired,
		Partitions: []uint32{partitionID},
	}
	for _, i := range w.inits {
		if !i.joiner || i.active {
			in.Alive[initiatorNode(i)] = 1
		}
		if hellos, ok := sr.told[i.idx]; ok {
			// Only the hellos since the loss speak of it (the node's
			// toldSince).
			var told recovery.SettleTold
			for _, h := range hellos {
				if h.conn > l.connsFrom {
					told.Since = true
					told.Missed = append(told.Missed, h.missed...)
				}
			}
			in.Told[initiatorNode(i)] = map[uint64]recovery.SettleTold{1: told}
		}
	}
	created := uint64(w.coord.nodes[sr.id].Created)
	for _, r := range w.coord.history {
		// The nodes with replicas run no initiator here: only an
		// initiator's registration is one a settlement checks.
		if r.initiator && r.rev > l.rev && r.rev <= created {
			// The replicas live for some view of it: from its
			// registration on.
			others := []string{}
			for _, node := range l.others {
				if l.lastLive[node] >= r.rev {
					others = append(others, node)
				}
			}
			in.Meanwhile = append(in.Meanwhile, recovery.SettleProcess{Node: r.node, Inc: r.inc, Others: map[uint32][]string{partitionID: others}})
		}
	}
	in.Others = map[uint32][]string{partitionID: l.others}
	if w.opts.Sabotage == SabotageSettleAlone {
		// The planted bug: every replica taken for the only live one.
		in.Others = map[uint32][]string{partitionID: nil}
	}
	if w.opts.Sabotage == SabotageSettleMissed {
		// The planted bug: what the hellos said is not heard.
		for _, byInc := range in.Told {
			for inc, told := range byInc {
				byInc[inc] = recovery.SettleTold{Since: told.Since}
			}
		}
	}
	o := recovery.Settle(in)
	switch o.Verdict {
	case recovery.SettleWait:
		if _, ok := l.waits[o.WaitFor]; !ok {
			l.waits[o.WaitFor] = w.tick
			w.stats.SettleWaits++
			w.tracef("%s node: settling waits for the feed of %s", sr.id, o.WaitFor)
		}
		if w.tick >= l.waits[o.WaitFor]+missedWaitTicks {
			l.expired[o.WaitFor] = true
			w.tracef("%s node: no feed of %s within %d ticks", sr.id, o.WaitFor, missedWaitTicks)
		}
		return
	case recovery.SettleKeep:
		if len(o.Alone) > 0 {
			w.stats.SettledAlone++
			w.tracef("%s node: its replica is the only one live since the loss: kept whatever %v say", sr.id, o.Gaps)
		}
		if sr.failed {
			w.tracef("%s node: settled: nothing more missed (lapsed %v, gaps %v); its replica had failed already", sr.id, l.lapsed, o.Gaps)
			break
		}
		if sr.held {
			// Kept, a held replica stays held: only a rejoin from a
			// live replica or an admin's accept-loss ends a hold.
			w.tracef("%s node: settled: nothing more missed (lapsed %v, gaps %v); its replica stays held", sr.id, l.lapsed, o.Gaps)
			break
		}
		w.stats.SettledKept++
		w.tracef("%s node: settled: its replica stays live (lapsed %v, gaps %v)", sr.id, l.lapsed, o.Gaps)
	case recovery.SettleFail:
		if sr.failed {
			w.tracef("%s node: settled: %s; its replica had failed already", sr.id, o.Fail[partitionID])
			break
		}
		w.stats.SettledFailed++
		if len(o.Unknown) > 0 {
			w.stats.SettleUnknown++
		}
		w.loseSource(sr, o.Fail[partitionID])
	}
	sr.loss = nil
}

// failSource fails sr's replica (recovery.Replica.Fail) for something
// other than txns it may lack (its core refused a txn): it needs a
// rejoin, which the run does not model, so it is out of the run: no
// source of a rejoin, compared with nothing, fed nothing. The placement
// says so, and the initiators stop waiting for it.
func (w *world) failSource(sr *srcReplica, why string) {
	if sr.failed {
		return
	}
	w.callOut(sr, func() { sr.core.Fail(why) })
	w.outSource(sr, why, false)
}

// callOut makes call, which may end sr's replica, with every attempt
// on its node told why its source may abort, and drains what the core
// produced, as the node does after any call. The replica is out of the
// run before the drain, so that the check at its aborted source's end
// (checkReleased) does not step a replica that runs no more (seed
// 811000412, on a first cut that marked it after).
func (w *world) callOut(sr *srcReplica, call func()) {
	a := w.srcAttemptOn(sr)
	for _, b := range w.atts {
		if b.sn == sr {
			b.replicaFailed = true
		}
	}
	call()
	switch sr.core.State() {
	case recovery.ReplicaHeld:
		sr.held = true
	case recovery.ReplicaNeedsRejoin:
		sr.failed, sr.held = true, false
	}
	if a != nil {
		w.afterCall(a)
	} else {
		w.drain(sr.core, sr.id)
	}
}

// outSource is sr's replica out of the run, failed or held: its record
// says needs-rejoin (with why, if held), and the initiators' view has it
// live no more from the next tick (this may run within a dial).
func (w *world) outSource(sr *srcReplica, why string, held bool) {
	heldWhy := ""
	if held {
		heldWhy = why
	}
	for i := range w.coord.replicas {
		if w.coord.replicas[i].Node == sr.id {
			w.coord.replicas[i].State = recovery.ReplicaNeedsRejoin
			w.coord.replicas[i].Held = heldWhy
		}
	}
	w.coord.write()
	for i, rp := range w.view.Placement[partitionID] {
		if rp.Node == sr.id {
			w.view.Placement[partitionID][i].Live = false
		}
	}
	w.viewDirty = true
	if held {
		w.tracef("%s node: replica held: %s", sr.id, why)
		return
	}
	w.tracef("%s node: replica failed: %s", sr.id, why)
}

// setInView puts node into the initiators' view or takes it out of it.
// As in the node's view (recovery/node's placementOf), a replica is live
// only while its node is in the view and its record says live: an
// initiator whose feed to a node out of its view is still open sends it
// txns and waits for none of its answers.
func (w *world) setInView(node string, in bool) {
	if in {
		w.view.Nodes[node] = 1
	} else {
		delete(w.view.Nodes, node)
	}
	live := false
	for _, r := range w.coord.replicas {
		if r.Node == node {
			live = r.State == recovery.ReplicaLive
		}
	}
	for i, rp := range w.view.Placement[partitionID] {
		if rp.Node == node {
			w.view.Placement[partitionID][i].Live = in && live
		}
	}
}

// noteOthersLive adds to sr's loss the nodes whose replica record says
// live while their node has a record, now.
func (w *world) noteOthersLive(sr *srcReplica) {
	l := sr.loss
	for _, r := range w.coord.replicas {
		if _, recorded := w.coord.nodes[r.Node]; r.Node != sr.id && recorded && r.State == recovery.ReplicaLive {
			if !slices.Contains(l.others, r.Node) {
				l.others = append(l.others, r.Node)
			}
			if l.lastLive == nil {
				l.lastLive = map[string]uint64{}
			}
			l.lastLive[r.Node] = w.coord.rev
		}
	}
}

// unsettled reports whether sr lost its registration and has not settled
// what its replica missed meanwhile.
func (sr *srcReplica) unsettled() bool { return sr.loss != nil }

// out reports whether sr's replica is out of the run: its node dead, or
// the replica failed or held.
func (sr *srcReplica) out() bool { return sr.dead || sr.failed || sr.held }

// registration is one node record's creation in the coordinator's
// history: a process's registration, first or again.
type registration struct {
	node      string
	inc       uint64
	rev       uint64
	initiator bool // the node runs an initiator
}

// joinerWorkload is a tick of the joiner's workload, drawn from its own
// stream: a txn, refused while its feed to a node alive in its view is
// not open yet (a definite failure), or a heartbeat.
func (w *world) joinerWorkload(in *initiator, sending, final bool) {
	r := in.rng
	txn := r.IntN(100) < w.k.TxnPct
	switch {
	case (sending && txn) || final:
		if err := w.sendTxn(in, w.drawTxn(r), w.view); err != nil {
			w.stats.JoinerRefused++
			w.tracef("i%d: txn refused: %v", in.id, err)
		}
		in.core.Tick()
		w.routeFeed(in)
	case w.quiescing:
		w.sendHeartbeat(in)
	default:
		in.core.Tick()
		w.routeFeed(in)
	}
}
