package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// The destination side of a rejoin: a hello checked against the task's claim
// in etcd, the attempt on the replica's goroutine, and its end, live or not.

// dstAttempt is one rejoin that rebuilds a replica of this node.
type dstAttempt struct {
	peer    string
	epoch   uint64
	started time.Time
	link    *link
	// blocks are the buffers the attempt's reads copy blocks into, given
	// back once the replica goroutine has handed the block to the core
	// (which keeps nothing of its tuples: the table copies each row).
	blocks freeBufs
	// proc is the core's destination, read for status only.
	proc *recovery.Destination
	live bool
	// watch are the nodes whose failure ends the attempt (partitionWatch).
	watch []string
	// attachMu orders the connections of the attempt.
	attachMu sync.Mutex
}

func (a *dstAttempt) status() RejoinStatus {
	return rejoinStatus("destination", a.peer, a.epoch, a.proc.State(), a.proc.Metrics(), a.started)
}

// startDest begins an attempt of epoch from peer, superseding a lower one,
// or resumes the current attempt on a new connection (same epoch and
// peer). The fence is the core's (recovery.Replica.CheckDestination): an
// attempt that ended, here or in an earlier run of the node, never starts
// again.
func (r *replica) startDest(peer string, epoch uint64) (*dstAttempt, error) {
	resume, err := r.core.CheckDestination(peer, epoch)
	if err != nil {
		return nil, err
	}
	if resume {
		return r.dst, nil
	}
	// Durable before anything of the attempt happens: once it has, a
	// restart must not take this epoch again.
	if err := r.n.store.RaiseEpoch(r.p, epoch); err != nil {
		return nil, err
	}
	err = r.core.StartDestination(peer, recovery.DestinationConfig{
		Header:         wire.MsgHeader{Epoch: epoch, Partition: r.p},
		StallTicksMax:  stallTicks,
		HeartbeatTicks: 10,
		BufferBytesMax: r.n.cfg.RejoinBufferBytesMax,
	})
	r.drain() // the superseded attempt's end
	if err != nil {
		return nil, err
	}
	att := &dstAttempt{peer: peer, epoch: epoch, watch: partitionWatch(r.n.members.view(), r.p, r.n.id),
		started: time.Now(), link: newLink(wire.CodecNone), blocks: newFreeBufs(), proc: r.core.Destination()}
	r.dst = att
	r.n.replicaRejoining(r.p, epoch)
	r.publish()
	return att, nil
}

func (r *replica) onDestMessage(att *dstAttempt, m wire.Message) {
	if r.dst != att {
		return
	}
	if _, ok := m.(*wire.Block); ok {
		// A block is applied under one of the node's apply slots
		// (Config.ApplyMax): the node's other replicas, some live and
		// taking writes, wait at most a block's apply for a core, not
		// the scheduler's slice. The wait holds only this replica, whose
		// txns are buffered until its handoff anyway.
		select {
		case r.n.applySlots <- struct{}{}:
		case <-r.n.ctx.Done():
			return
		}
		defer func() { <-r.n.applySlots }()
		if f := r.n.cfg.knobs.applying; f != nil {
			f(r.p)
		}
	}
	if err := r.core.OnDestinationMessage(att.epoch, m); err != nil {
		r.n.limited.Log(slog.LevelInfo, fmt.Sprintf("dest-refused/%d/%v", r.p, m.Type()), "destination refused a message", "partition", r.p, "epoch", att.epoch, "type", m.Type(), "err", err)
	}
	r.drain()
}

// abortDest ends the destination attempt att from outside.
func (r *replica) abortDest(att *dstAttempt, reason wire.AbortReason, text string) {
	r.core.AbortDestination(att.epoch, reason, text)
	r.drain()
}

// destLive: the core made att's replica live.
func (r *replica) destLive(att *dstAttempt) {
	att.live = true
	r.builtFrom = att.started
	st := att.status()
	st.Ended = time.Now()
	r.lastDst = &st
	r.n.metrics.observeRejoin(r.p, st)
	// The initiators it waits for: one that never speaks holds its
	// execution, and its partition, until that process is taken for dead.
	r.n.log.Info("replica live", "partition", r.p, "epoch", att.epoch, "source", att.peer,
		"rows", st.Rows, "seconds", st.Ended.Sub(att.started).Seconds(), "initiators", r.core.Initiators())
	r.n.replicaChanged(r, true, att.epoch)
	r.n.goRun(func() {
		// The HandoffAck goes out first: the source is done only
		// with it. The source closes the connection once it is done;
		// the writer ends with it, or with this close.
		att.link.drain(3 * time.Second)
		select {
		case <-time.After(time.Second):
		case <-r.n.ctx.Done():
		}
		att.link.close()
	})
	r.publish()
}

// endDest drops an aborted or superseded attempt: the core dropped the
// partial replica with it.
func (r *replica) endDest() {
	att := r.dst
	st := att.status()
	if err := att.proc.Err(); err != nil {
		st.Err = err.Error()
	}
	st.Ended = time.Now()
	r.lastDst = &st
	r.n.metrics.observeRejoin(r.p, st)
	r.dst = nil
	r.n.log.Info("rejoin attempt ended", "partition", r.p, "epoch", att.epoch, "err", st.Err)
	r.n.goRun(func() {
		// The Abort goes out first: a source that never hears of a
		// digest mismatch waits out its stall window for the ack.
		att.link.drain(time.Second)
		att.link.close()
	})
	r.publish()
}

// serveRejoin is the destination's end of one attempt's connection.
func (n *Node) serveRejoin(c *stream.Conn, h *wire.Hello, refuse func(string, ...any)) {
	r := n.hosted()[h.Partition]
	if r == nil {
		refuse("no replica of partition %d here", h.Partition)
		return
	}
	if err := n.checkHolder(h); err != nil {
		refuse("%v", err)
		return
	}
	type started struct {
		att *dstAttempt
		err error
	}
	s, ok := ask(r, func(r *replica) started {
		att, err := r.startDest(h.Node, h.Epoch)
		return started{att, err}
	})
	if !ok {
		return
	}
	if s.err != nil {
		refuse("%v", s.err)
		return
	}
	att := s.att
	att.attachMu.Lock()
	att.link.attach(c)
	resumed, _ := ask(r, func(r *replica) bool {
		if r.dst != att || att.live {
			return false
		}
		att.link.drop()
		err := r.core.ResumeDestination(att.epoch)
		r.drain()
		return err == nil
	})
	if !resumed {
		att.attachMu.Unlock()
		refuse("attempt of epoch %d ended", h.Epoch)
		return
	}
	// The answer goes first, ahead of whatever Resume queued.
	if err := c.Send(n.ctx, &wire.Hello{Kind: h.Kind, Node: n.id, Partition: h.Partition, Epoch: h.Epoch}); err != nil {
		att.attachMu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(n.ctx)
	defer cancel()
	att.link.run(ctx, c, func(context.Context) {})
	att.attachMu.Unlock()
	n.readRejoinInto(ctx, c, att.blocks, func(context.Context) {}, func(m wire.Message) {
		r.do(func(r *replica) {
			r.onDestMessage(att, m)
			// Applied, refused or dropped, the block is done with. An
			// event that never runs (the node stops) leaves its buffer
			// to the collector.
			giveBlock(att.blocks, m)
		})
	})
}

// holderReadTimeout bounds the destination's read of a task's claim.
const holderReadTimeout = 2 * time.Second

// checkHolder checks a rejoin hello against etcd: the dialer says it is
// node h.Node working the attempt of epoch h.Epoch on this node's replica
// of h.Partition, so the task's claim must stand, at that epoch, held by
// that node (supervise.ExecutorID names it), and the task's assignment
// must name that node its source. A process that took a dead node's
// address, or a claim holder whose claim is gone, is refused before the
// replica hears of it; so is a claim a node wrote for itself: every node
// may write claims (it works the tasks assigned to it), and a claim holder
// claims only what the supervisor assigned it, whose reassignments delete
// the claim they replace.
func (n *Node) checkHolder(h *wire.Hello) error {
	task := claim.Task{Partition: h.Partition, Dest: n.id}
	ctx, cancel := context.WithTimeout(n.ctx, holderReadTimeout)
	defer cancel()
	hold, found, a, assigned, err := supervise.HolderAndAssignment(ctx, n.cli, task)
	switch {
	case err != nil:
		return err
	case !found:
		return fmt.Errorf("no claim on task %s: %s at epoch %d holds none", task, h.Node, h.Epoch)
	case hold.Node != h.Node || hold.Epoch != h.Epoch:
		return fmt.Errorf("the claim on task %s is %q's at epoch %d, not %q's at %d", task, hold.Node, hold.Epoch, h.Node, h.Epoch)
	case !assigned:
		return fmt.Errorf("the claim on task %s is %s's at epoch %d, but the supervisor assigned it to nobody: a claim outside the assignment", task, h.Node, h.Epoch)
	case a.Source != h.Node:
		return fmt.Errorf("the claim on task %s is %s's at epoch %d, but the supervisor assigned it to %s: a claim outside the assignment", task, h.Node, h.Epoch, a.Source)
	}
	return nil
}

// completeLive completes the task of a replica gone live, trying again
// until etcd takes it (or says it is done, or of another generation), for
// as long as the node runs. If etcd is out when the source's HandoffAck
// lands, the source's completion fails too, and a task left open would
// send new attempts to a replica that refuses them as live, forever (the
// simulator found it: recovery/sim, coordinator outages).
func (n *Node) completeLive(a claim.Attempt) {
	for try := 0; ; try++ {
		var err error
		if try < n.cfg.knobs.completeFails {
			err = errors.New("test: etcd out")
		} else {
			ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
			_, _, err = supervise.Complete(ctx, n.cli, a, time.Now(), n.log)
			cancel()
		}
		if !supervise.CompleteAgain(err) || n.ctx.Err() != nil {
			return
		}
		n.limited.Log(slog.LevelWarn, "complete/"+a.Task.String(), "complete rejoin task; retrying", "task", a.Task, "err", err)
		select {
		case <-time.After(completeRetry):
		case <-n.ctx.Done():
			return
		}
	}
}

// openTasks opens the rejoin tasks of replicas that need one, at most
// IncomingMax at once (the per-node limit): the supervisor assigns each a
// source.
func (n *Node) openTasks(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !n.hearsEveryone() || n.cfg.knobs.noTasks {
			continue // a rejoin proposes once it heard every initiator
		}
		var need []uint32
		for p, r := range n.hosted() {
			// A held replica waits for a live replica of its partition to
			// be rebuilt from; with none, a task would wait for a source
			// that cannot be, and outlive an accepted loss.
			if st := r.status.Load(); st != nil && st.State != recovery.ReplicaLive && n.placedSeen(r) &&
				(st.State != recovery.ReplicaHeld || n.liveElsewhere(p)) {
				need = append(need, p)
			}
		}
		sort.Slice(need, func(i, j int) bool { return need[i] < need[j] })
		for _, p := range need {
			n.openMu.Lock()
			full := len(n.opened) >= n.cfg.IncomingMax
			have := n.opened[p]
			n.openMu.Unlock()
			if have || full {
				continue
			}
			task := claim.Task{Partition: p, Dest: n.id}
			_, err := claim.CreateTask(ctx, n.cli, task, time.Now())
			if err != nil && !errors.Is(err, claim.ErrTaskOpen) {
				n.limited.Log(slog.LevelWarn, "open-task/"+task.String(), "open rejoin task", "task", task, "err", err)
				continue
			}
			n.openMu.Lock()
			n.opened[p] = true
			n.openMu.Unlock()
			n.log.Info("rejoin task open", "task", task)
		}
	}
}

// hearsEveryone reports whether a feed is open from every live node's
// initiator.
func (n *Node) hearsEveryone() bool {
	n.feeds.mu.Lock()
	defer n.feeds.mu.Unlock()
	heard := map[string]bool{}
	for _, f := range n.feeds.by {
		heard[f.node] = true
	}
	for node := range n.members.view().nodes {
		if !heard[node] {
			return false
		}
	}
	return true
}

// completeRetry spaces a live destination's tries at completing its task.
const completeRetry = 500 * time.Millisecond
