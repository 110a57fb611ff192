package node

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// The replica loop's bounds: at most recovery.StepBurst txns run between
// two looks at the inbox, and at most inboxBurst events are taken before
// txns run again, so neither starves the other.
const (
	inboxBurst = 256
	inboxMax   = 1 << 14
	// tickEvery is the processors' tick: their timeouts are counted in it.
	tickEvery = 10 * time.Millisecond
	// stallTicks: a rejoin attempt with no progress for 10 s aborts. Long
	// enough for a fault hold in the demo, short enough to free a replica
	// whose peer vanished without a word.
	stallTicks = 1000
	// queueTxnsMax bounds a replica's queued txns, a destination's buffer
	// included.
	queueTxnsMax = 1 << 21
)

// event is one input of a replica's loop: a closure run on its goroutine,
// which owns everything of the replica. Every input, feed or control,
// arrives this way.
type event func(r *replica)

// replica is one partition replica hosted by the node, owned by its loop
// goroutine. Every decision about it is its core's (recovery.Replica:
// lifecycle, executor, initiators, attempts, fence); the replica is the
// core's driver: it feeds it the feed, the attempts' messages and ticks,
// and does what the core's outbox says (drain).
type replica struct {
	n  *Node
	p  uint32
	in chan event

	core *recovery.Replica
	// dst and src are the driver's half of the core's attempts: the link,
	// the claim, the status; set and cleared as the core starts and ends
	// them. dst stays, live, after the handoff while the core keeps its
	// destination as the router of the feed.
	dst *dstAttempt
	src *srcAttempt
	// paceT measures the txns' waits while src's snapshot is paced
	// (pace.go); nil otherwise.
	paceT    *paceWaits
	executed uint64
	// tails: what the repair of a dead initiator's tail needs, the
	// highest ID taken in from each initiator and its latest txns.
	tails recovery.Tails
	// incOf is the incarnation of each initiator's current feed.
	incOf map[txnid.Initiator]uint64
	// beats are the heartbeat slots of the tracked initiators' feeds
	// (beats.go). beatsDue: the values last pulled from them apply once
	// this many more events have run; -1: none pending. beatDst is the
	// destination attempt the floors were last raised for.
	beats    map[txnid.Initiator]*beatIn
	beatsDue int
	beatDst  *recovery.Destination
	// armed: listed in the node's beatWaiters, owed a wake (wakeEv).
	armed  atomic.Bool
	wakeEv event
	// holdRows arms the fault hold for the next source attempts (see
	// srcAttempt.holdRows); 0: none.
	holdRows int64

	status atomic.Pointer[ReplicaStatus]
	// created is the creation revision of the placement record this
	// replica was made for (0: not known). Its state is published into
	// that record only: a record placed again after a move off the node
	// is a new replica's, which a late publication of this one's "live"
	// would make look rebuilt (reconcile.go).
	created int64
	// pubSeq numbers the replica's state changes, and pubMu orders their
	// publication: each goes out on a goroutine of its own, and one
	// stalled in etcd landed after the next, a replica failed and live
	// again would stay "needs a rejoin" in etcd (replicaChanged).
	pubSeq atomic.Uint64
	pubMu  sync.Mutex
	// placedAt is the revision at which the placement gave the node this
	// replica (its record's creation, or the view a move showed it in),
	// which every node's view must reach before its rejoin opens
	// (placedSeen); gone is closed once the loop ended for a drop
	// (reconcile.go).
	placedAt int64
	gone     chan struct{}
	dropped  bool
	// ticks counts the ticks run (tick), wakes the heartbeat wake-ups
	// queued (wake), for the tests.
	ticks, wakes atomic.Int64
	// lastDst and lastSrc keep the latest attempts' status after they end.
	lastDst, lastSrc *RejoinStatus
	// builtFrom is when the attempt that made the replica live began
	// (zero: live from the node's start, or not live).
	builtFrom time.Time
	// waitingSince (Unix nanoseconds) is since when the replica holds txns
	// it cannot run with none run since (noteWaiting), 0 when it runs or
	// holds none: the node says which initiator a stalled partition waits
	// for (logWait).
	waitingSince atomic.Int64
}

func newReplica(n *Node, p uint32, live bool) (*replica, error) {
	r := &replica{n: n, p: p, in: make(chan event, inboxMax), gone: make(chan struct{}),
		incOf: map[txnid.Initiator]uint64{},
		beats: map[txnid.Initiator]*beatIn{}, beatsDue: -1, wakeEv: func(*replica) {}}
	// The fence is the highest rejoin epoch this replica has seen as
	// destination, raised in the node's record, synced, before an attempt
	// starts: no attempt at or below it starts again, across attempts and
	// restarts (docs/DESIGN.md "Incarnations and fencing").
	fence, err := n.store.HighestEpoch(p)
	if err != nil {
		return nil, err
	}
	core, err := recovery.NewReplica(recovery.ReplicaConfig{Partition: p, Live: live, Fence: fence, NewExecutor: r.newExecutor})
	if err != nil {
		return nil, err
	}
	r.core = core
	r.publish()
	return r, nil
}

// newExecutor builds an empty partition with the cluster's tables and an
// executor over it; the core adds its initiators.
func (r *replica) newExecutor() (*partition.Executor, error) {
	part := partition.New()
	for _, s := range r.n.schemas {
		if _, err := part.CreateTable(s); err != nil {
			return nil, err
		}
	}
	return partition.NewExecutor(part, r.n.procs, partition.ExecutorConfig{QueueTxnsMax: queueTxnsMax}), nil
}

// do runs f on the replica's goroutine; false if the node is stopping
// or the replica was dropped (then f may never run).
func (r *replica) do(f event) bool {
	select {
	case r.in <- f:
		return true
	case <-r.n.ctx.Done():
		return false
	case <-r.gone:
		return false
	}
}

// ask runs f on the replica's goroutine and returns its result; false if
// the node stopped first (its loop may end with f still queued).
func ask[T any](r *replica, f func(r *replica) T) (T, bool) {
	res := make(chan T, 1)
	var zero T
	if !r.do(func(r *replica) { res <- f(r) }) {
		return zero, false
	}
	select {
	case v := <-res:
		return v, true
	case <-r.n.ctx.Done():
		return zero, false
	case <-r.gone:
		return zero, false
	}
}

// loop is the replica's goroutine: events, then ready txns, then ticks.
// The tick clock runs only while wantsTick: a replica with nothing under
// way is woken by its events alone, so thousands of idle replicas on a
// node cost nothing between writes (docs/DESIGN.md "Ticks only for
// attempts under way"). Heartbeats are read from the feeds' slots while
// the replica wants them, and wake it only if it waits for one
// (beats.go).
func (r *replica) loop() {
	t := time.NewTicker(tickEvery)
	t.Stop()
	ticking := false
	var tickC <-chan time.Time
	for {
		if r.dropped {
			close(r.gone)
			return
		}
		busy := false
		for range inboxBurst {
			select {
			case f := <-r.in:
				r.run(f)
				busy = true
				continue
			default:
			}
			break
		}
		if r.step() {
			busy = true
		}
		r.flushRejoins()
		if r.n.ctx.Err() != nil {
			r.stop()
			return
		}
		if want := r.wantsTick(); want != ticking {
			// Since Go 1.23 a stopped or reset ticker delivers no
			// stale tick: none arrives after Stop, the first after
			// Reset is tickEvery away.
			ticking = want
			if want {
				t.Reset(tickEvery)
				tickC = t.C
			} else {
				t.Stop()
				tickC = nil
				// The attempt's end, as the last tick would have
				// shown it (endSource does not publish).
				r.publish()
			}
		}
		// A txn that just came to an idle replica finds the heartbeats
		// that passed it here, not a heartbeat later.
		if r.maybePullBeats() {
			busy = true
		}
		if busy {
			select {
			case <-tickC:
				r.tick()
			default:
			}
			continue
		}
		if r.beatsDue < 0 && r.wantsBeats() {
			// Armed before the slots are read again: a heartbeat
			// stored after that read finds the replica listed.
			r.armBeats()
			if r.maybePullBeats() {
				continue
			}
		}
		select {
		case <-r.n.ctx.Done():
			r.stop()
			return
		case f := <-r.in:
			r.run(f)
		case <-tickC:
			r.tick()
		}
	}
}

// run runs one event of the inbox.
func (r *replica) run(f event) {
	f(r)
	r.ran()
	r.paceLook()
}

// wantsTick reports whether something of the replica counts ticks or
// must be seen every tick: the core's running attempts (a source, or a
// destination not yet live: recovery.Replica.Tick ticks nothing else;
// their stall windows, heartbeats and throttle are in ticks), and the
// driver's half of them, whose status is published every tick for the
// timeline and the membership checks (attemptOpen) and whose link's
// queued frames are moved on between events. Everything else the replica
// does is an answer to an event: txns of the feed run on arrival (step),
// heartbeats are read from the feeds' slots when they can let one run
// (wantsBeats), and every state change publishes itself.
func (r *replica) wantsTick() bool {
	return r.core.Source() != nil || r.core.State() == recovery.ReplicaRejoining ||
		r.src != nil || (r.dst != nil && !r.dst.live)
}

// stop ends the attempts when the node stops.
func (r *replica) stop() {
	r.core.Stop("node stopping")
	r.drain()
}

// step runs the ready txns and reports each result to its initiator; the
// core pumps the source between txns. It reports whether it did anything
// or the source has more to pump.
func (r *replica) step() bool {
	// The source's moves are timed from the start of each call
	// (srcAttempt.lastCheck), so the driver's half sees each one.
	var each func(step func() int) error
	if r.src != nil {
		each = func(step func() int) error {
			r.beforeSource()
			step()
			r.drain()
			return nil
		}
	}
	did, _, _ := r.core.Run(each)
	r.executed += uint64(did)
	r.n.metrics.txns.Add(float64(did))
	r.noteWaiting(did > 0)
	r.drain()
	if did > 0 {
		r.publish()
	}
	// A source that cut its last pump's share of blocks has more to cut
	// now (recovery.SourceConfig.PumpBlocksMax): the loop comes back
	// after the inbox, not after the next event.
	return did > 0 || r.core.SourcePending()
}

// noteWaiting records whether the replica holds txns it cannot run,
// after a step (ran: it ran some). A stall starts at the first step that
// ran none with txns held; each one run starts it again.
func (r *replica) noteWaiting(ran bool) {
	exec := r.core.Executor()
	switch {
	case exec == nil || exec.Queued() == 0:
		if r.waitingSince.Load() != 0 {
			r.waitingSince.Store(0)
		}
	case ran || r.waitingSince.Load() == 0:
		r.waitingSince.Store(time.Now().UnixNano())
	}
}

// logWait logs, if the replica still holds txns it cannot run, what it
// waits for: the tracked initiator furthest behind its oldest txn, the
// highest ID the replica took from it and the latest its feed brought
// (a heartbeat there not taken yet is the replica's to read, not the
// initiator's to send), or no initiator: a gate holds the txn.
func (r *replica) logWait() {
	since := r.waitingSince.Load()
	exec := r.core.Executor()
	if since == 0 || exec == nil || exec.Queued() == 0 {
		return
	}
	next, _ := exec.QueuedFrom(txnid.Zero)
	var in txnid.Initiator
	var heard txnid.ID
	for _, i := range exec.Initiators() {
		if last, ok := exec.LastFrom(i); ok && last < next && (in == 0 || last < heard) {
			in, heard = i, last
		}
	}
	attrs := []any{"partition", r.p, "queued", exec.Queued(), "oldest", next, "waited", time.Since(time.Unix(0, since)).Round(time.Millisecond)}
	if in == 0 {
		r.n.limited.Log(slog.LevelWarn, fmt.Sprintf("replica-wait/%d", r.p), "replica holds txns it cannot run: a gate holds them (a rejoin's handoff or a tail's repair), no initiator is behind", attrs...)
		return
	}
	feed := txnid.Zero
	if b := r.beats[in]; b != nil {
		feed = b.slot.load()
	}
	attrs = append(attrs, "initiator", in, "node", NodeName(int(in)), "taken", heard, "feed", feed)
	r.n.limited.Log(slog.LevelWarn, fmt.Sprintf("replica-wait/%d", r.p), "replica holds txns it cannot run: an initiator has not passed the oldest", attrs...)
}

func (r *replica) tick() {
	r.ticks.Add(1)
	r.beforeSource()
	r.core.Tick()
	r.drain()
	r.paceTick()
	r.publish()
}

// onTxnAt takes a txn its feed's reader read at t.
func (r *replica) onTxnAt(inv partition.Invocation, t time.Time) {
	if r.paceT != nil {
		r.paceT.txn(inv.ID, t)
	}
	r.onTxn(inv)
}

// onTxn takes a txn of the feed. One at or below what the replica took
// from its initiator is there already: a resumed feed sends again what
// the replica may have taken meanwhile from a peer's repair of the
// initiator's tail, cut short when the process came back (feedLost).
// Within one feed, IDs only grow, and a heartbeat applies only once the
// txns below it have run (beats.go), so nothing else is skipped.
func (r *replica) onTxn(inv partition.Invocation) {
	if r.executing() && inv.ID <= r.tails.Last(inv.ID.Initiator()) {
		return
	}
	if r.core.OnTxn(inv) {
		r.took(inv.ID, &inv)
		r.tookFrom(inv.ID)
	}
	r.drain()
}

// onBeat takes a heartbeat of the feed, read from its slot (applyBeats).
func (r *replica) onBeat(id txnid.ID) {
	if r.core.OnHeartbeat(id) {
		r.took(id, nil)
		r.tookFrom(id)
	}
	r.drain()
}

// addInitiator: a feed from in's incarnation inc opened; its heartbeats
// are read from slot. Its first message follows.
func (r *replica) addInitiator(in txnid.Initiator, inc uint64, slot *beatSlot) {
	if inc < r.incOf[in] {
		// A feed of an older process, added late (trackFeeds read it
		// before a newer process's feed replaced it): its slot would
		// hold back or mislead the newer one's tracking.
		return
	}
	r.incOf[in] = inc
	r.bindBeats(in, slot)
	r.core.AddInitiator(in)
	r.drain()
}

// joinFloor is the replica's part of the floor of a feed from in
// (feed.go): recovery.Replica.JoinFloor, and at least the last ID taken
// from an earlier process of in. A txn at or below that is dropped here
// as one taken already (onTxn), and a repair asks its peers for what
// lies past it, so a new process's IDs must start above it. A quiet
// process's heartbeats lead its clock (Config.BeatLead), past the safe
// point the other initiators hold: its restart's first txns came below
// its last heartbeat, were dropped, and held its feed's heartbeats
// behind them for good (TestRestartBelowItsLastBeat).
func (r *replica) joinFloor(in txnid.Initiator) txnid.ID {
	return max(r.core.JoinFloor(), r.tails.Last(in))
}

// removeInitiator: in's node is dead; nothing more comes from it.
func (r *replica) removeInitiator(in txnid.Initiator) {
	delete(r.beats, in)
	r.core.RemoveInitiator(in)
	r.drain()
}

// fail drops the replica's content: it is no longer a copy (a refused txn,
// a feed lost while its initiator lives). It needs a rejoin.
func (r *replica) fail(why string) {
	r.core.Fail(why)
	r.drain()
}

// lose: the replica may lack txns its partition acknowledged elsewhere.
// It fails if another replica of the partition is live in the node's
// view to rebuild it from, and is held otherwise (recovery.Replica.Lose):
// a network fault alone never takes a partition's last live replica.
func (r *replica) lose(why string) {
	r.core.Lose(why, r.n.liveElsewhere(r.p))
	r.drain()
}

// acceptLoss: an admin accepted the loss of what the held replica
// missed (its record's supervise.Replica.LossAccepted): it goes live at
// its last txn. A replica no longer held (rebuilt, or failed, since)
// writes its record as it stands, which clears the acceptance.
//
// rev is the revision of the record that says so: a rejoin task opened
// for the held replica (a live replica seemed to be back) is completed at
// it, as a destination completes its task at its epoch, so that no source
// is sent to a replica live again.
func (r *replica) acceptLoss(rev int64) {
	if state := r.core.State(); state != recovery.ReplicaHeld {
		if state != recovery.ReplicaLive {
			r.n.log.Info("a loss accepted for a replica no longer held: its record is written as it stands", "partition", r.p, "state", state)
		}
		r.n.replicaChanged(r, state == recovery.ReplicaLive, 0)
		return
	}
	if err := r.core.AcceptLoss(); err != nil {
		r.n.log.Error("accept a loss", "partition", r.p, "err", err)
	}
	r.drain()
	r.n.openMu.Lock()
	opened := r.n.opened[r.p]
	delete(r.n.opened, r.p)
	r.n.openMu.Unlock()
	if opened {
		a := claim.Attempt{Task: claim.Task{Partition: r.p, Dest: r.n.id}, Executor: r.n.id + ":accept-loss", Epoch: uint64(rev)}
		r.n.goRun(func() { r.n.completeLive(a) })
	}
}

// liveElsewhere reports whether the view has a replica of p live on another
// node.
func (n *Node) liveElsewhere(p uint32) bool {
	return slices.ContainsFunc(n.members.view().placement[p], func(pl replicaPlace) bool { return pl.live && pl.node != n.id })
}

// beforeSource notes the time before a call into the core that may move
// the source attempt (see srcAttempt.lastCheck).
func (r *replica) beforeSource() {
	if r.src != nil {
		r.src.lastCheck = time.Now()
	}
}

// paced gives the pacer the wait of txn id, run now.
func (r *replica) paced(id txnid.ID) {
	if wait, ok := r.paceT.ran(id, time.Now()); ok {
		r.src.pace.observe(wait)
	}
}

// paceLook gives the pacer the safe point after what the replica took in
// (paceWaits.look).
func (r *replica) paceLook() {
	if r.paceT == nil {
		return
	}
	if exec := r.core.Executor(); exec != nil {
		if safe, ok := exec.PeekSafe(); ok {
			r.paceT.look(safe, exec.Queued() > 0, time.Now())
		}
	}
}

// drain does what the core produced, in order: each txn's Done to its
// initiator, messages onto the attempts' links, endings and state changes
// into the records and logs. What it does may produce more (an abort),
// which it does too.
func (r *replica) drain() {
	for _, d := range r.core.Results() {
		if r.paceT != nil {
			r.paced(d.ID)
		}
		r.n.feeds.done(d.ID.Initiator(), d)
	}
	for {
		outs := r.core.Outbox()
		if len(outs) == 0 {
			break
		}
		for _, o := range outs {
			r.output(o)
		}
	}
	r.afterSource()
}

func (r *replica) output(o recovery.Output) {
	switch o.Kind {
	case recovery.OutSourceMessages:
		if att := r.src; att != nil && att.epoch == o.Epoch {
			r.sendSource(att, o)
		}
	case recovery.OutSourceEnded:
		if att := r.src; att != nil && att.epoch == o.Epoch {
			if o.Err == nil {
				// Done: the destination is live at E with our digest.
				if att.holdAt.IsZero() {
					att.holdAt = att.lastCheck
				}
				if att.doneAt.IsZero() {
					att.doneAt = time.Now()
				}
			}
			att.err = o.Err
			r.endSource()
		}
	case recovery.OutDestinationMessages:
		if att := r.dst; att != nil && att.epoch == o.Epoch {
			msgs := o.Msgs
			if r.n.cfg.knobs.loseHandoffAck {
				msgs = slices.DeleteFunc(msgs, func(m wire.Message) bool { return m.Type() == wire.MsgHandoffAck })
			}
			if err := att.link.queue(msgs); err != nil {
				r.core.AbortDestination(att.epoch, wire.AbortInternal, err.Error())
			}
		}
	case recovery.OutLive:
		if att := r.dst; att != nil && att.epoch == o.Epoch {
			r.destLive(att)
		}
	case recovery.OutDestinationEnded:
		if att := r.dst; att != nil && att.epoch == o.Epoch {
			r.endDest()
		}
	case recovery.OutFailed:
		r.n.log.Error("replica failed, needs a rejoin", "partition", r.p, "why", o.Why)
		r.n.feeds.forget(r.p)
		r.dst = nil
		r.n.replicaChanged(r, false, 0)
		r.publish()
	case recovery.OutHeld:
		// Nothing it ran and did not answer yet goes out: it may lack
		// txns those answers would hide.
		r.n.log.Error("replica held: it may lack txns of its partition and no other replica is live; it answers nothing until a live replica comes back to rebuild it from or an admin accepts the loss (rejoin accept-loss)", "partition", r.p, "why", o.Why)
		r.n.feeds.forget(r.p)
		r.n.replicaChanged(r, false, 0)
		r.publish()
	case recovery.OutLossAccepted:
		r.n.log.Warn("held replica live again at its last txn: the loss of what it missed was accepted", "partition", r.p)
		r.n.replicaChanged(r, true, 0)
		r.publish()
	}
}

func (r *replica) rows() int64 {
	exec := r.core.Executor()
	if exec == nil {
		return 0
	}
	var n int64
	for _, t := range exec.Partition().Tables() {
		n += int64(t.Len())
	}
	return n
}

// publish refreshes the status others read.
func (r *replica) publish() {
	st := &ReplicaStatus{Partition: r.p, State: r.core.State(), TxnsExecuted: r.executed, Held: r.core.Held()}
	if exec := r.core.Executor(); exec != nil && (r.core.State() == recovery.ReplicaLive || r.core.State() == recovery.ReplicaHeld) {
		st.Rows = r.rows()
		st.Digest = exec.Partition().Digest()
		st.LastExecuted = uint64(exec.LastExecuted())
	}
	if r.dst != nil {
		d := r.dst.status()
		st.Rejoin = &d
	} else if r.lastDst != nil {
		d := *r.lastDst
		st.Rejoin = &d
	}
	if r.src != nil {
		st.Sources = append(st.Sources, r.src.status())
	} else if r.lastSrc != nil {
		st.Sources = append(st.Sources, *r.lastSrc)
	}
	r.status.Store(st)
}

func rejoinStatus(role, peer string, epoch uint64, state recovery.State, m recovery.Metrics, started time.Time) RejoinStatus {
	rows := m.Snapshot.Rows + m.Upserts.Rows + m.Deletes.Rows
	st := RejoinStatus{
		Role: role, Peer: peer, Epoch: epoch, Phase: state.String(),
		Rows:          int64(rows),
		Bytes:         int64(m.Snapshot.Bytes + m.Upserts.Bytes + m.Deletes.Bytes),
		SnapshotRows:  int64(m.Snapshot.Rows),
		Rounds:        m.Rounds,
		LogBytesPeak:  m.LogBytesPeak,
		ThrottledMs:   float64(m.ThrottledTicks) * float64(tickEvery) / float64(time.Millisecond),
		BlocksResent:  m.BlocksResent,
		StaleRejected: m.StaleRejected,
		Started:       started,
	}
	st.PeerHoldMs = float64(m.PeerHoldTicks) * float64(tickEvery) / float64(time.Millisecond)
	st.BufferBytesPeak = m.BufferBytesPeak
	return st
}

// checkPeers ends an attempt whose other side's node died and, on the
// destination, an attempt during which a node of the partition failed
// (DESIGN.md step 8): the source's failure handling, seeing the attempt
// end, starts a fresh one, which watches the nodes live at its start.
func (r *replica) checkPeers(v *view) {
	if att := r.dst; att != nil && !att.live {
		if _, ok := v.nodes[att.peer]; !ok {
			r.core.AbortDestination(att.epoch, wire.AbortNodeFailed, "source node "+att.peer+" died")
		} else if node, failed := failedNode(v, r.p, att.watch); failed {
			r.core.AbortDestination(att.epoch, wire.AbortNodeFailed, fmt.Sprintf("node %s of partition %d failed", node, r.p))
		}
	}
	if att := r.src; att != nil {
		if _, ok := v.nodes[att.task.Dest]; !ok {
			r.core.AbortSource(att.epoch, wire.AbortNodeFailed, "destination node "+att.task.Dest+" died")
		}
	}
	r.drain()
}
