package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// The source side of a rejoin: the assignment loop takes the node's
// assignments and claims each task; the attempt core (supervise.Holding)
// decides the rest of the attempt's life, from starting the task to
// completing or requeuing it, and holdAttempt does its I/O, serving the
// attempt from the replica's goroutine (docs/DESIGN.md "The rejoin
// protocol", steps 1 and 9, and "The attempt core").

// resumeGrace is how long a source keeps a rejoin whose connection broke,
// redialling, before it gives the attempt up.
const resumeGrace = 5 * time.Second

// brokenHoldMax is how long a source whose connection to the destination
// broke keeps holding its partition's txns for it (the destination's
// hold, or the handoff's pause) before it gives the attempt up: the
// writes of a partition with a live replica here must not wait out
// resumeGrace for a destination that may be gone. Before, a source held
// on for resumeGrace: a destination killed in the handoff's pause (and
// back at once, a new process with no attempt to resume) held a
// partition whose other replicas were up for 3.95 s (rejoin chaos
// --net-faults on --seed 20261208, +553.09 s; the bound is 3 s).
const brokenHoldMax = time.Second

// brokenCheckEvery is the attempt core's tick: how often a broken
// attempt's timers are looked at (its redials, its grace, its hold).
const brokenCheckEvery = 100 * time.Millisecond

// srcAttempt is one rejoin this node serves as source. proc and the
// fault hold belong to the replica goroutine; the rest is set before the
// attempt starts or is atomic.
type srcAttempt struct {
	task    claim.Task
	claim   *claim.Claim
	epoch   uint64
	started time.Time
	link    *link
	// proc is the core's source, read for status and the fault hold.
	proc *recovery.Source
	// end is closed by the replica goroutine once proc is final; err is
	// then its outcome (nil: done).
	end chan struct{}
	err error

	// holdRows > 0: hold the destination's acks once the snapshot has sent
	// this many rows (the demo's mid-snapshot fault point).
	holdRows int64
	held     bool
	heldAcks []wire.Message
	// lastCheck is when the core was last called or drained, before the
	// next call that may move the source (beforeSource); holdAt is the
	// lastCheck before the call in which the source began to hand off, doneAt when it was seen to have sent the Handoff
	// and released the partition. So the handoff pause holdAt..doneAt is
	// wall time, never under-reported.
	lastCheck, holdAt, doneAt time.Time
	// pauseUntil (unix nanos): the attempt's I/O stands still until then.
	pauseUntil atomic.Int64

	// pace is the snapshot's pacer (pace.go).
	pace paceCtl

	// touching is set while a refresh of the task record is in flight;
	// when one is due is the claim's guard's rule (claim.Guard.MaybeTouch).
	touching atomic.Bool
}

func (a *srcAttempt) status() RejoinStatus {
	s := rejoinStatus("source", a.task.Dest, a.epoch, a.proc.State(), a.proc.Metrics(), a.started)
	s.Held = a.held
	s.PacedBytesPerSec, s.PaceStarts = a.pace.rate, a.pace.starts
	if !a.doneAt.IsZero() {
		s.HandoffPauseMs = float64(a.doneAt.Sub(a.holdAt)) / float64(time.Millisecond)
	}
	return s
}

// pause waits while the attempt is paused (fault injection).
func (a *srcAttempt) pause(ctx context.Context) {
	for {
		d := time.Until(time.Unix(0, a.pauseUntil.Load()))
		if d <= 0 {
			return
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return
		}
	}
}

// startSource begins serving att on this replica. A newer attempt at the
// same task supersedes the one running here; another task waits for the
// replica's one source attempt to end (recovery.Replica.StartSource).
func (r *replica) startSource(att *srcAttempt) error {
	cfg := recovery.DefaultSourceConfig(wire.MsgHeader{Epoch: att.epoch, Partition: r.p})
	cfg.StallTicksMax = r.n.cfg.sourceStallTicks()
	if old := r.src; old != nil && old.task == att.task && att.epoch > old.epoch {
		r.n.log.Info("source attempt superseded", "task", old.task, "epoch", old.epoch, "by", att.epoch)
	}
	err := r.core.StartSource(att.task.Dest, cfg)
	r.drain() // the superseded attempt's end
	if err != nil {
		return err
	}
	att.proc = r.core.Source()
	att.pace.target = r.n.cfg.PaceTarget
	att.holdRows = r.holdRows
	att.lastCheck = time.Now()
	r.src = att
	r.drain()
	return nil
}

// onSourceMessage hands the destination's message to the source.
func (r *replica) onSourceMessage(att *srcAttempt, m wire.Message) {
	if r.src != att {
		return // an ended attempt's late message
	}
	if ack, ok := m.(*wire.Ack); ok && (att.held || (att.holdRows > 0 && att.proc.Metrics().Snapshot.Rows >= att.holdRows)) {
		att.held = true
		if len(att.heldAcks) < linkFramesMax {
			att.heldAcks = append(att.heldAcks, ack)
		}
		return
	}
	att.lastCheck = time.Now()
	if err := r.core.OnSourceMessage(att.epoch, m); err != nil {
		r.n.limited.Log(slog.LevelInfo, fmt.Sprintf("source-refused/%d/%v", r.p, m.Type()), "source refused a message", "partition", r.p, "epoch", att.epoch, "type", m.Type(), "err", err)
	}
	r.drain()
}

// releaseHold lets the held acks through.
func (r *replica) releaseHold() {
	att := r.src
	if att == nil {
		return
	}
	att.holdRows = 0
	acks := att.heldAcks
	att.held, att.heldAcks = false, nil
	for _, m := range acks {
		if r.src != att {
			return
		}
		att.lastCheck = time.Now()
		_ = r.core.OnSourceMessage(att.epoch, m)
		r.drain()
	}
}

// sendSource queues what the source produced on its link.
func (r *replica) sendSource(att *srcAttempt, o recovery.Output) {
	msgs := o.Msgs
	if !o.State.Final() && !att.claim.Held(time.Now()) {
		// The lease guard: a claim that may have expired sends nothing
		// more, whatever the claim holder believes. The abort comes next.
		r.core.AbortSource(att.epoch, wire.AbortClaimLost, "claim not certainly held")
		return
	}
	if f := r.n.cfg.knobs.handoff; f != nil {
		msgs = testHandoffs(f, att.epoch, msgs)
	}
	if err := att.link.queue(msgs); err != nil {
		r.core.AbortSource(att.epoch, wire.AbortInternal, err.Error())
	}
}

// afterSource notes the handoff's wall-clock pause and refreshes the
// task record when due, after the core has moved the source.
func (r *replica) afterSource() {
	att := r.src
	if att == nil {
		return
	}
	now := time.Now()
	r.maybeTouch(att, now)
	if att.proc.State() == recovery.StateHandingOff {
		if att.holdAt.IsZero() {
			att.holdAt = att.lastCheck
		}
		if att.doneAt.IsZero() && att.proc.HandoffSent() {
			att.doneAt = now
		}
	}
	att.lastCheck = now
}

// maybeTouch refreshes the task record, off the replica goroutine, when
// the claim's guard says one is due: the attempt made progress since the
// last refresh, at most once a claim window (claim.Guard.MaybeTouch, the
// rule the simulator runs too). The record's age is then the time since
// the attempt's last progress, give or take a window, which is what the
// health task judges it by (docs/DESIGN.md step 1): a long rejoin that moves on
// is never reset.
func (r *replica) maybeTouch(att *srcAttempt, now time.Time) {
	if att.proc.State().Final() || att.touching.Load() || !att.claim.MaybeTouch(now, att.proc.Progress()) {
		return
	}
	att.touching.Store(true)
	r.n.goRun(func() {
		defer att.touching.Store(false)
		ctx, cancel := context.WithTimeout(r.n.ctx, att.claim.Window())
		defer cancel()
		if _, err := claim.Touch(ctx, r.n.cli, att.claim.Attempt(), time.Now()); err != nil && r.n.ctx.Err() == nil {
			// Not the holder any more: the claim's own checks end the
			// attempt within a window.
			r.n.limited.Log(slog.LevelInfo, "touch/"+att.task.String(), "touch rejoin task", "task", att.task, "epoch", att.epoch, "err", err)
		}
	})
}

// testHandoffs passes every Handoff in msgs through the test hook f.
func testHandoffs(f func(uint64, *wire.Handoff) *wire.Handoff, epoch uint64, msgs []wire.Message) []wire.Message {
	out := msgs[:0:0]
	for _, m := range msgs {
		if h, ok := m.(*wire.Handoff); ok {
			c := *h // the source keeps its own to check the ack against
			if n := f(epoch, &c); n != nil {
				out = append(out, n)
			}
			continue
		}
		out = append(out, m)
	}
	return out
}

func (r *replica) endSource() {
	att := r.src
	if att.err == nil && att.proc.State() != recovery.StateDone {
		att.err = att.proc.Err()
		if att.err == nil {
			att.err = errors.New("ended")
		}
	}
	st := att.status()
	if att.err != nil {
		st.Err = att.err.Error()
	}
	st.Ended = time.Now()
	r.lastSrc = &st
	r.src = nil
	r.paceT = nil
	r.n.metrics.observeRejoin(r.p, st)
	close(att.end)
}

// holdAssignments works the node's assignments: one claim and one
// attempt per assignment, Complete or Requeue at the end (docs/DESIGN.md
// steps 1 and 9). It keeps a copy of the assignments naming this node
// (supervise.Assignments), listed once and then moved on by a watch, and
// takes a new one as its event arrives; it read them all from etcd every
// 100 ms before. The ticker only looks at the copy again, for the gate
// below, and lists anew once a watch failed.
func (n *Node) holdAssignments() {
	taken := supervise.Taken{}
	var as *supervise.Assignments
	var wch clientv3.WatchChan
	stopWatch := func() {}
	defer func() { stopWatch() }()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case task := <-n.retry:
			// A failed attempt was requeued: the assignment stands, so
			// take it again (as a new claim, with a higher epoch).
			taken.Retry(task)
		case wr, ok := <-wch:
			err := wr.Err()
			for _, ev := range wr.Events {
				if err == nil {
					err = as.Apply(ev)
				}
			}
			if !ok && err == nil {
				err = errors.New("watch ended")
			}
			if err != nil {
				// Compacted past the copy, etcd's leader lost, a record
				// that does not decode: list again.
				if n.ctx.Err() == nil {
					n.limited.Log(slog.LevelWarn, "watch-assignments", "watching assignments", "err", err)
				}
				stopWatch()
				as, wch = nil, nil
				continue
			}
		case <-t.C:
		}
		if as == nil {
			lctx, cancel := context.WithTimeout(n.ctx, n.cfg.EtcdTimeout)
			list, err := supervise.ListAssignments(lctx, n.cli, n.id)
			cancel()
			if err != nil {
				if n.ctx.Err() == nil {
					n.limited.Log(slog.LevelWarn, "read-assignments", "reading assignments", "err", err)
				}
				continue
			}
			wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(n.ctx))
			as, wch, stopWatch = list, supervise.WatchAssignments(wctx, n.cli, list.Rev), cancel
		}
		if !n.reg.Registered() || int64(n.reg.Term().Seq) != n.settledTerm.Load() {
			// No new claim without a registration, nor before a lapse is
			// settled: a replica about to be failed for what it missed
			// would hand its stale content to a destination that goes
			// live with it (registration.go).
			continue
		}
		for _, a := range as.Mine() {
			if taken.Take(a) {
				n.takeAssignment(a)
			}
		}
	}
}

func (n *Node) takeAssignment(a supervise.Assignment) {
	r := n.hosted()[a.Task.Partition]
	decline := func(why string) {
		n.log.Info("declining rejoin", "task", a.Task, "seq", a.Seq, "why", why)
		if err := supervise.Decline(n.ctx, n.cli, a.Task, n.id, a.Seq); err != nil {
			n.log.Warn("decline", "task", a.Task, "err", err)
		}
	}
	if r == nil {
		decline("no replica here")
		return
	}
	if int(n.outgoing.Load()) >= n.cfg.OutgoingMax {
		decline("over the outgoing limit")
		return
	}
	c, err := claim.Acquire(n.ctx, n.cli, a.Task, supervise.ExecutorID(n.id), n.cfg.ClaimTTL, claim.WithWindow(n.cfg.ClaimWindow))
	if err != nil {
		n.log.Info("claim not taken", "task", a.Task, "err", err)
		return
	}
	if err := n.reg.Hold(c); err != nil {
		_ = c.Release(n.ctx)
		return
	}
	att := &srcAttempt{task: a.Task, claim: c, epoch: c.Epoch(), started: time.Now(), link: newLink(n.cfg.Codec), end: make(chan struct{})}
	n.outgoing.Add(1)
	n.goRun(func() {
		defer n.outgoing.Add(-1)
		n.holdAttempt(r, att)
	})
}

// holdingConfig is the attempt core's timing, in wall-clock nanoseconds.
var holdingConfig = supervise.HoldingConfig{ResumeGrace: int64(resumeGrace), BrokenHoldMax: int64(brokenHoldMax),
	RedialEvery: int64(redialEvery), RetryAfter: int64(retryAfter)}

// redialEvery spaces a source's redials of a broken rejoin connection.
const redialEvery = 200 * time.Millisecond

// holdAttempt is the driver of one attempt's core (supervise.Holding),
// which decides everything from the claim to its release; this does its
// I/O: etcd's calls, the dials, the connection's reader, the replica
// goroutine's calls, and time as ticks. Results come back to its loop
// as events, so the core sees them one at a time, in the order they
// happened here.
func (n *Node) holdAttempt(r *replica, att *srcAttempt) {
	// The core's ticks are wall-clock nanoseconds, read here alone.
	tick := func() int64 { return time.Now().UnixNano() }
	h, err := supervise.NewHolding(holdingConfig, tick())
	if err != nil {
		panic(err) // holdingConfig is the package's own (TestHoldingConfigValid)
	}
	log := n.log.With("task", att.task, "epoch", att.epoch)
	ctx, cancel := context.WithCancel(n.ctx)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	// events carry what the dials and the reader found; post delivers one
	// unless the loop is over (a connection it brings is then closed).
	events := make(chan func(now int64), 4)
	post := func(ev func(now int64), conn *stream.Conn) {
		select {
		case events <- ev:
		case <-done:
			if conn != nil {
				conn.Close()
			}
		}
	}
	// pending is a dial's connection not yet given to the link; reading
	// numbers the link's connections, so a reader's end is a break of
	// the current one only; readDone closes when the current one's reader
	// ends (the destination closed the connection, or it broke).
	var pending *stream.Conn
	var reading uint64
	var readDone chan struct{}
	lost, end, stop := att.claim.Lost(), (<-chan struct{})(att.end), ctx.Done()
	sourceEnded := false
	// The core's ticks matter only while the connection is broken (its
	// redials, its grace, its hold): the ticker runs then alone, and an
	// attempt that streams is not woken ten times a second for nothing.
	var t *time.Ticker
	var ticks <-chan time.Time
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	// etcdAfter bounds an etcd call that ends the attempt, which must be
	// made also when the node stops (the requeue that says so).
	etcdAfter := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(n.ctx), 5*time.Second)
	}
	for {
		h.Run(func(a supervise.HoldAction) {
			switch a.Kind {
			case supervise.HoldStartTask:
				_, err := claim.StartTask(ctx, n.cli, att.claim.Attempt(), time.Now())
				if err != nil {
					log.Warn("start task", "err", err)
				}
				h.TaskStarted(tick(), err)
			case supervise.HoldDial:
				n.goRun(func() {
					conn, err := n.dialRejoin(ctx, att)
					post(func(now int64) {
						if err == nil {
							pending = conn
						}
						h.Connected(now, err)
					}, conn)
				})
			case supervise.HoldStartSource, supervise.HoldResumeSource:
				conn := pending
				pending = nil
				att.link.attach(conn)
				first := a.Kind == supervise.HoldStartSource
				err, ok := ask(r, func(r *replica) error {
					if first {
						return r.startSource(att)
					}
					if r.src != att {
						return errors.New("attempt ended")
					}
					att.link.drop()
					att.lastCheck = time.Now()
					err := r.core.ResumeSource(att.epoch)
					r.drain()
					return err
				})
				if !ok {
					err = errors.New("replica stopped")
				}
				if err == nil {
					if !first {
						log.Info("rejoin connection resumed", "partition", att.task.Partition)
					}
					// The link and its reader outlive the loop: an ended
					// attempt's last frames go out after it (closeEnded).
					att.link.run(n.ctx, conn, att.pause)
					reading++
					gen, rd := reading, make(chan struct{})
					readDone = rd
					n.goRun(func() {
						defer close(rd)
						n.readRejoin(n.ctx, conn, att.pause, func(m wire.Message) {
							r.do(func(r *replica) { r.onSourceMessage(att, m) })
						})
						post(func(now int64) {
							if gen == reading && !sourceEnded {
								log.Info("rejoin connection broke; resuming", "partition", att.task.Partition)
								h.Broke(now)
							}
						}, nil)
					})
				}
				h.SourceStarted(tick(), err)
			case supervise.HoldAbortSource:
				reason, why := a.Reason, a.Why
				if reason == wire.AbortConnLost {
					log.Info("rejoin attempt given up", "why", why)
				}
				r.do(func(r *replica) {
					if r.src == att {
						r.core.AbortSource(att.epoch, reason, why)
						r.drain()
					}
				})
			case supervise.HoldClose:
				if pending != nil {
					pending.Close()
					pending = nil
				} else if !sourceEnded {
					att.link.cut()
				}
			case supervise.HoldComplete:
				fctx, fcancel := etcdAfter()
				_, _, err := supervise.Complete(fctx, n.cli, att.claim.Attempt(), time.Now(), n.log)
				fcancel()
				if err != nil {
					log.Warn("complete", "err", err)
				}
				log.Info("rejoin served")
				h.Finished(tick(), err)
			case supervise.HoldRequeue:
				fctx, fcancel := etcdAfter()
				_, err := claim.Requeue(fctx, n.cli, att.claim.Attempt(), a.Why, time.Now())
				fcancel()
				switch {
				case errors.Is(err, claim.ErrTaskFinal):
					// Typically the destination completed the task itself:
					// it went live with our digest and only its HandoffAck
					// was lost. Done is done; nothing to retry.
					log.Info("rejoin attempt failed, but its task is final", "err", a.Why, "requeue", err)
				case err != nil && n.ctx.Err() == nil:
					log.Info("rejoin attempt failed; requeue failed", "err", a.Why, "requeue", err)
				default:
					log.Info("rejoin attempt failed; requeued", "err", a.Why)
				}
				h.Finished(tick(), err)
			case supervise.HoldRelease:
				fctx, fcancel := etcdAfter()
				_ = att.claim.Release(fctx)
				fcancel()
			case supervise.HoldRetry:
				wait := time.Until(time.Unix(0, a.At))
				n.goRun(func() {
					select {
					case <-time.After(wait):
					case <-n.ctx.Done():
						return
					}
					select {
					case n.retry <- att.task:
					case <-n.ctx.Done():
					}
				})
			}
		})
		if h.Released() {
			break
		}
		switch {
		case h.Broken() && t == nil:
			t = time.NewTicker(brokenCheckEvery)
			ticks = t.C
		case !h.Broken() && t != nil:
			t.Stop()
			t, ticks = nil, nil
		}
		select {
		case ev := <-events:
			ev(tick())
		case <-ticks:
			holds, _ := ask(r, func(r *replica) bool { return r.src == att && att.proc.HoldsPartition() })
			h.Tick(tick(), holds)
		case <-lost:
			lost = nil
			h.ClaimLost(tick(), fmt.Sprintf("claim lost: %v", att.claim.Err()))
		case <-end:
			end, sourceEnded = nil, true
			rd := readDone
			n.goRun(func() { n.closeEnded(att, rd) })
			h.SourceEnded(tick(), att.err)
		case <-stop:
			stop = nil
			h.Stop(tick())
		}
	}
	if pending != nil {
		pending.Close()
	}
	if !sourceEnded {
		att.link.close()
		if h.Started() {
			// The source was aborted (a stop): its end comes from the
			// replica goroutine, which must not outlive the node.
			select {
			case <-att.end:
			case <-n.ctx.Done():
			}
		}
	}
}

// closeEnded lets an ended attempt's last messages out (the handoff, an
// abort), half-closes the connection so that the destination reads them
// all, and closes it once the destination closed its side (its reader,
// readDone, ended), or 3 s later. It outlives the attempt's loop, which
// does not wait for it.
func (n *Node) closeEnded(att *srcAttempt, readDone <-chan struct{}) {
	att.link.drain(3 * time.Second)
	att.link.closeWrite()
	select {
	case <-readDone:
	case <-time.After(3 * time.Second):
	case <-n.ctx.Done():
	}
	att.link.close()
}

// dialRejoin connects to the destination and says which attempt this is.
func (n *Node) dialRejoin(ctx context.Context, att *srcAttempt) (*stream.Conn, error) {
	addr, err := n.members.address(att.task.Dest)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cfg := n.dialConfig(att.task.Dest)
	cfg.RateBytesPerSec = n.cfg.RateBytesPerSec
	conn, err := stream.Dial(dctx, addr, cfg)
	if err != nil {
		return nil, err
	}
	if err := hello(dctx, conn, &wire.Hello{Kind: wire.HelloRejoin, Node: n.id, Partition: att.task.Partition, Epoch: att.epoch}, att.task.Dest); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// retryAfter spaces the attempts a source makes at one assignment.
const retryAfter = 500 * time.Millisecond

// paceTick moves the source's pacer on by a tick: it runs while the
// snapshot streams, if Config.PaceTarget is positive (pace.go).
func (r *replica) paceTick() {
	att := r.src
	if att == nil || att.pace.target <= 0 {
		return
	}
	if att.proc.State() != recovery.StateStreaming {
		if r.paceT != nil {
			r.paceT = nil
			att.pace.rate = 0
			att.link.setPace(0)
		}
		return
	}
	if r.paceT == nil {
		r.paceT = newPaceWaits()
		att.pace.begin(time.Now(), att.link.written.Load())
		return
	}
	if rate, changed := att.pace.tick(time.Now(), att.link.written.Load()); changed {
		att.link.setPace(rate)
	}
}
