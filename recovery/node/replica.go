package node

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// The replica loop's bounds: at most stepBurst txns run between two looks
// at the inbox, and at most inboxBurst events are taken before txns run
// again, so neither starves the other.
const (
	stepBurst  = 256
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
// goroutine: the executor, the partition, and the rejoin processors
// working on it.
type replica struct {
	n  *Node
	p  uint32
	in chan event

	// state is StateLive, StateRejoining or StateNeedsRejoin.
	state string
	// exec is nil while the replica needs a rejoin and no attempt runs:
	// the feed is dropped then, a new attempt buffers from its start.
	exec *partition.Executor
	// initiators are those heard from on a feed, added to every new
	// executor.
	initiators map[txnid.Initiator]bool
	dst        *dstAttempt
	src        *srcAttempt
	executed   uint64
	// lastFrom is the highest ID taken in from each initiator, recent its
	// latest txns: what the repair of a dead initiator's tail needs.
	lastFrom map[txnid.Initiator]txnid.ID
	recent   map[txnid.Initiator]*txnRing
	// incOf is the incarnation of each initiator's current feed.
	incOf map[txnid.Initiator]uint64
	// holdRows arms the fault hold for the next source attempts (see
	// srcAttempt.holdRows); 0: none.
	holdRows int64
	// fence is the highest rejoin epoch this replica has seen as
	// destination, read from the node's record at start and raised there,
	// synced, before an attempt starts: no attempt at or below it starts
	// again, across attempts and restarts (DESIGN.md "Incarnations and
	// fencing").
	fence uint64

	status atomic.Pointer[ReplicaStatus]
	// lastDst and lastSrc keep the latest attempts' status after they end.
	lastDst, lastSrc *RejoinStatus
}

func newReplica(n *Node, p uint32, live bool) (*replica, error) {
	r := &replica{n: n, p: p, in: make(chan event, inboxMax), initiators: map[txnid.Initiator]bool{}, state: StateNeedsRejoin,
		lastFrom: map[txnid.Initiator]txnid.ID{}, recent: map[txnid.Initiator]*txnRing{}, incOf: map[txnid.Initiator]uint64{}}
	fence, err := n.store.HighestEpoch(p)
	if err != nil {
		return nil, err
	}
	r.fence = fence
	if live {
		exec, err := r.newExecutor()
		if err != nil {
			return nil, err
		}
		r.exec, r.state = exec, StateLive
	}
	r.publish()
	return r, nil
}

// newExecutor builds an empty partition with the cluster's tables and an
// executor over it that hears every known initiator.
func (r *replica) newExecutor() (*partition.Executor, error) {
	part := partition.New()
	for _, s := range r.n.schemas {
		if _, err := part.CreateTable(s); err != nil {
			return nil, fmt.Errorf("node: partition %d: %w", r.p, err)
		}
	}
	exec := partition.NewExecutor(part, r.n.procs, partition.ExecutorConfig{QueueTxnsMax: queueTxnsMax})
	for in := range r.initiators {
		exec.AddInitiator(in)
	}
	return exec, nil
}

// do runs f on the replica's goroutine; false if the node is stopping.
func (r *replica) do(f event) bool {
	select {
	case r.in <- f:
		return true
	case <-r.n.ctx.Done():
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
	}
}

func (r *replica) loop() {
	t := time.NewTicker(tickEvery)
	defer t.Stop()
	for {
		busy := false
		for range inboxBurst {
			select {
			case f := <-r.in:
				f(r)
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
		if busy {
			select {
			case <-t.C:
				r.tick()
			default:
			}
			continue
		}
		select {
		case <-r.n.ctx.Done():
			r.stop()
			return
		case f := <-r.in:
			f(r)
		case <-t.C:
			r.tick()
		}
	}
}

// stop ends the attempts when the node stops.
func (r *replica) stop() {
	if r.src != nil {
		r.src.proc.Abort(wire.AbortShutdown, "node stopping")
		r.endSource()
	}
	if r.dst != nil && !r.dst.live {
		r.dst.proc.Abort(wire.AbortShutdown, "node stopping")
		r.endDest()
	}
}

// step runs the ready txns, reports each result to its initiator, and
// pumps the source between txns.
func (r *replica) step() bool {
	if r.exec == nil {
		return false
	}
	did := false
	for range stepBurst {
		res, ok := r.exec.Step()
		if !ok {
			break
		}
		did = true
		r.executed++
		r.n.metrics.txns.Inc()
		r.n.feeds.done(res.ID.Initiator(), &wire.Done{Partition: r.p, ID: res.ID, Out: append([]byte(nil), res.Out...), Err: wire.ErrText(res.Err)})
		if r.src != nil {
			r.src.lastCheck = time.Now()
			r.src.proc.Pump()
			r.checkSource()
		}
	}
	if r.src != nil {
		r.src.lastCheck = time.Now()
		r.src.proc.Pump()
		r.checkSource()
	}
	if did {
		r.publish()
	}
	return did
}

func (r *replica) tick() {
	if r.src != nil {
		r.src.lastCheck = time.Now()
		r.src.proc.Tick()
		r.checkSource()
	}
	if r.dst != nil {
		r.dst.proc.Tick()
		r.checkDest()
	}
	r.publish()
}

// onTxn takes a txn of the feed.
func (r *replica) onTxn(inv partition.Invocation) {
	switch {
	case r.dst != nil:
		if err := r.dst.proc.OnTxn(inv); err != nil {
			// A txn of the feed that is not taken in leaves a hole: a
			// live replica is no longer a copy, an attempt would build one
			// that is not.
			r.refused(fmt.Sprintf("txn %v refused: %v", inv.ID, err))
			return
		}
		r.took(inv.ID, &inv)
		r.checkDest()
	case r.exec != nil:
		if err := r.exec.Offer(inv); err != nil {
			// The replica can no longer follow the feed: it is not a
			// copy any more.
			r.fail(fmt.Sprintf("txn %v refused: %v", inv.ID, err))
			return
		}
		r.took(inv.ID, &inv)
	}
}

// onBeat takes a heartbeat of the feed.
func (r *replica) onBeat(id txnid.ID) {
	switch {
	case r.dst != nil:
		if err := r.dst.proc.OnHeartbeat(id); err != nil {
			r.refused(fmt.Sprintf("heartbeat %v refused: %v", id, err))
			return
		}
		r.took(id, nil)
		r.checkDest()
	case r.exec != nil:
		if err := r.exec.Heartbeat(id); err != nil {
			r.fail(fmt.Sprintf("heartbeat %v refused: %v", id, err))
			return
		}
		r.took(id, nil)
	}
}

// refused ends what the replica was doing after its rejoin attempt, or the
// replica it made live, could not take in a message of the feed.
func (r *replica) refused(why string) {
	if r.dst != nil && !r.dst.live {
		r.dst.proc.Abort(wire.AbortInternal, why)
		r.checkDest()
		return
	}
	r.fail(why)
}

// addInitiator: a feed from in's incarnation inc opened. Its first
// message follows.
func (r *replica) addInitiator(in txnid.Initiator, inc uint64) {
	r.incOf[in] = inc
	if r.initiators[in] {
		return
	}
	r.initiators[in] = true
	switch {
	case r.dst != nil:
		// The attempt buffers the newcomer's txns too. What it sent
		// before went to the source alone: the attempt's proposal waits
		// for it, and its handoff checks it holds the newcomer's txns
		// from E on (docs/DESIGN.md "Feeds that open late").
		r.dst.proc.AddInitiator(in)
		r.checkDest()
	case r.exec != nil:
		r.exec.AddInitiator(in)
	}
}

// executedUpTo is the highest txn ID the replica executed or handed off,
// Zero when it has no executor: a feed's floor (feed.go).
func (r *replica) executedUpTo() txnid.ID {
	if r.exec == nil {
		return txnid.Zero
	}
	return r.exec.LastExecuted()
}

// removeInitiator: in's node is dead; nothing more comes from it.
func (r *replica) removeInitiator(in txnid.Initiator) {
	if !r.initiators[in] {
		return
	}
	delete(r.initiators, in)
	if r.dst != nil {
		r.dst.proc.RemoveInitiator(in)
		r.checkDest()
		return
	}
	if r.exec != nil {
		r.exec.RemoveInitiator(in)
	}
}

// fail drops the replica's content: it is no longer a copy (a refused txn,
// a feed lost while its initiator lives). It needs a rejoin.
func (r *replica) fail(why string) {
	if r.state == StateNeedsRejoin {
		return
	}
	r.n.log.Error("replica failed, needs a rejoin", "partition", r.p, "why", why)
	if r.src != nil {
		r.src.proc.Abort(wire.AbortShutdown, "source replica failed: "+why)
		r.endSource()
	}
	if r.dst != nil && !r.dst.live {
		r.dst.proc.Abort(wire.AbortShutdown, "destination replica failed: "+why)
		r.endDest()
	}
	r.dst, r.exec, r.state = nil, nil, StateNeedsRejoin
	r.n.replicaChanged(r.p, false, 0)
	r.publish()
}

func (r *replica) rows() int64 {
	if r.exec == nil {
		return 0
	}
	var n int64
	for _, t := range r.exec.Partition().Tables() {
		n += int64(t.Len())
	}
	return n
}

// publish refreshes the status others read.
func (r *replica) publish() {
	st := &ReplicaStatus{Partition: r.p, State: r.state, TxnsExecuted: r.executed}
	if r.exec != nil && r.state == StateLive {
		st.Rows = r.rows()
		st.Digest = r.exec.Partition().Digest()
		st.LastExecuted = uint64(r.exec.LastExecuted())
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
	if r.dst != nil && !r.dst.live {
		if _, ok := v.nodes[r.dst.peer]; !ok {
			r.dst.proc.Abort(wire.AbortNodeFailed, "source node "+r.dst.peer+" died")
			r.checkDest()
		} else if node, failed := failedNode(v, r.p, r.dst.watch); failed {
			r.dst.proc.Abort(wire.AbortNodeFailed, fmt.Sprintf("node %s of partition %d failed", node, r.p))
			r.checkDest()
		}
	}
	if r.src != nil {
		if _, ok := v.nodes[r.src.task.Dest]; !ok {
			r.src.proc.Abort(wire.AbortNodeFailed, "destination node "+r.src.task.Dest+" died")
			r.checkSource()
		}
	}
}
