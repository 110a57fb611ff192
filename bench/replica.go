package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// The driver loop's bound. Between two looks at its inputs a driver runs
// at most recovery.StepBurst txns, and it handles at most inboundBurst
// inputs before it executes again, so neither a flood of blocks nor a
// backlog of txns starves the other side (the destination waiting for an
// ack, the source's queue).
const inboundBurst = 64

// errStopped: the run's context ended, the driver was told to stop. Not a
// failure of the driver; run returns nil for it.
var errStopped = errors.New("bench: stopped")

// handler is what differs between the source and the destination driver:
// how the feed is taken in, what a message and a tick do, what the replica
// does between inputs, and when it is finished.
type handler interface {
	onBatch(b *batch) error
	onMessage(m wire.Message) error
	onTick() error
	// control is a channel of the handler's own (nil: none) and onControl
	// what to do when it is ready.
	control() <-chan struct{}
	onControl() error
	// work does what can be done without waiting, and reports whether it
	// did anything.
	work() (bool, error)
	// outbox returns the messages to send to the peer, in order.
	outbox() []wire.Message
	// linkOpen reports whether to read the peer's frames yet.
	linkOpen() bool
	// finished reports whether the driver is done (its final report is
	// written).
	finished() (bool, error)
}

// finalReport is a replica's state once the feed has ended and every txn
// has run: what the digest comparison needs.
type finalReport struct {
	last   txnid.ID // LastExecuted
	fence  txnid.ID // the feed's last txn
	digest uint64
	rows   int
}

// replica is the part of a driver the two sides share: one executor, the
// feed from the initiator, the two directions of the link, and the loop.
// Everything in it belongs to the driver's goroutine, except executed
// (read by Run while the loop goes on) and what the loop publishes by
// closing a channel.
type replica struct {
	name string
	// core is the replica's core, the one recovery/node runs: it owns the
	// executor and the processor, routes the feed, and pumps the source
	// after every txn. exec is its executor.
	core      *recovery.Replica
	exec      *partition.Executor
	feed      <-chan *batch
	in, out   *link
	codec     wire.Codec
	tickEvery time.Duration

	enc wire.FrameEncoder
	dec wire.FrameDecoder
	// pending holds frames the link had no room for, in order. Invariant:
	// len(pending) <= pendingMax; the protocol's window bounds it well
	// below (see RejoinConfig.LinkFramesMax), so reaching the bound is an
	// error rather than a wait.
	pending    [][]byte
	pendingMax int
	// wireBytes counts the frame bytes sent.
	wireBytes int64

	// executed counts the txns this replica's executor ran.
	executed atomic.Int64

	// ending is set once the end batch is taken in; fence is its txn.
	ending bool
	fence  txnid.ID
	final  finalReport
	// finalDone is closed once final is written.
	finalDone chan struct{}
}

func newReplica(name string, feed <-chan *batch, in, out *link, cfg RejoinConfig) replica {
	return replica{
		name:       name,
		feed:       feed,
		in:         in,
		out:        out,
		codec:      cfg.Codec,
		tickEvery:  cfg.Tick,
		pendingMax: cfg.LinkFramesMax,
		finalDone:  make(chan struct{}),
	}
}

// loop runs the driver until h is finished or ctx ends.
func (r *replica) loop(ctx context.Context, h handler) error {
	t := time.NewTicker(r.tickEvery)
	defer t.Stop()
	for {
		busy := false
		for range inboundBurst {
			got, err := r.poll(ctx, h, t.C, false)
			if err != nil {
				return r.stopped(err)
			}
			if !got {
				break
			}
			busy = true
			// Send what the input produced at once: an ack held back
			// until the burst ends holds back the source's next block,
			// and the link runs stop-and-go, a window at a time.
			if err := r.flush(h.outbox()); err != nil {
				return err
			}
		}
		did, err := h.work()
		if err != nil {
			return err
		}
		if err := r.flush(h.outbox()); err != nil {
			return err
		}
		if done, err := h.finished(); done || err != nil {
			return err
		}
		if !busy && !did {
			if _, err := r.poll(ctx, h, t.C, true); err != nil {
				return r.stopped(err)
			}
		}
	}
}

func (r *replica) stopped(err error) error {
	if errors.Is(err, errStopped) {
		return nil
	}
	return err
}

// poll handles one input, waiting for it if block is set; without block it
// reports false when nothing was ready. Sending a pending frame counts as
// an input: it is what the loop waits for when the link is full.
func (r *replica) poll(ctx context.Context, h handler, tick <-chan time.Time, block bool) (bool, error) {
	var out chan<- []byte
	var next []byte
	if len(r.pending) > 0 {
		out, next = r.out.frames, r.pending[0]
	}
	var in <-chan []byte
	if h.linkOpen() {
		in = r.in.frames
	}
	ctl := h.control()
	if block {
		select {
		case <-ctx.Done():
			return false, errStopped
		case b := <-r.feed:
			return true, h.onBatch(b)
		case f := <-in:
			return true, r.onFrame(h, f)
		case <-tick:
			return true, h.onTick()
		case out <- next:
			r.popPending()
			return true, nil
		case <-ctl:
			return true, h.onControl()
		}
	}
	select {
	case <-ctx.Done():
		return false, errStopped
	case b := <-r.feed:
		return true, h.onBatch(b)
	case f := <-in:
		return true, r.onFrame(h, f)
	case <-tick:
		return true, h.onTick()
	case out <- next:
		r.popPending()
		return true, nil
	case <-ctl:
		return true, h.onControl()
	default:
		return false, nil
	}
}

func (r *replica) popPending() {
	r.pending[0] = nil
	r.pending = r.pending[1:]
}

// onFrame decodes a frame from the peer and hands the message to h. The
// buffer goes back to the sender afterwards: a decoded block's tuples
// alias it (or the decoder's buffer), and the processor has applied them
// by the time onMessage returns.
func (r *replica) onFrame(h handler, f []byte) error {
	m, n, err := r.dec.DecodeFrame(f)
	if err != nil {
		return fmt.Errorf("bench: %s: decode frame: %w", r.name, err)
	}
	if n != len(f) {
		return fmt.Errorf("bench: %s: frame of %d bytes in a buffer of %d", r.name, n, len(f))
	}
	err = h.onMessage(m)
	r.in.recycle(f)
	return err
}

// flush encodes msgs as frames and sends them, keeping in pending what the
// link has no room for now.
func (r *replica) flush(msgs []wire.Message) error {
	for _, m := range msgs {
		f, err := r.enc.AppendFrame(r.out.buffer(), m, r.codec)
		if err != nil {
			return fmt.Errorf("bench: %s: encode %v: %w", r.name, m.Type(), err)
		}
		r.wireBytes += int64(len(f))
		if len(r.pending) == 0 {
			select {
			case r.out.frames <- f:
				continue
			default:
			}
		}
		if len(r.pending) >= r.pendingMax {
			return fmt.Errorf("bench: %s: %d frames wait for the link, limit %d: the peer stopped reading", r.name, len(r.pending), r.pendingMax)
		}
		r.pending = append(r.pending, f)
	}
	return nil
}

// step is the driver's turn at the txns (recovery.Replica.Run), with call
// around each while the source attempt runs (the source times its moves
// around each call; nil: none). It reports whether any ran or the source
// has more to pump. A procedure error is a result both replicas reach
// alike; the digests compare what they did.
func (r *replica) step(call func(func()) error) (bool, error) {
	var each func(step func() int) error
	if call != nil {
		each = func(step func() int) error { return call(func() { step() }) }
	}
	n, more, err := r.core.Run(each)
	r.executed.Add(int64(n))
	return more, err
}

// messages returns the messages the core has for the peer, in order. An
// attempt's end shows in its processor's state, which the drivers check.
func (r *replica) messages() []wire.Message {
	var msgs []wire.Message
	for _, o := range r.core.Outbox() {
		if o.Kind == recovery.OutSourceMessages || o.Kind == recovery.OutDestinationMessages {
			msgs = append(msgs, o.Msgs...)
		}
	}
	return msgs
}

// refused is the error for a txn or heartbeat id the core did not take in:
// it failed the replica or ended its attempt, and says why in its outbox.
func (r *replica) refused(id txnid.ID) error {
	why := "dropped"
	for _, o := range r.core.Outbox() {
		switch {
		case o.Kind == recovery.OutFailed:
			why = o.Why
		case o.Err != nil:
			why = o.Err.Error()
		}
	}
	return fmt.Errorf("bench: %s: %v refused: %s", r.name, id, why)
}

// takeEnd records the end batch's fence.
func (r *replica) takeEnd(b *batch) {
	r.ending = true
	r.fence = b.txns[len(b.txns)-1].ID
}

// maybeFinish writes the final report once the feed has ended and every
// txn has run.
func (r *replica) maybeFinish() (bool, error) {
	if !r.ending {
		return false, nil
	}
	if _, ok := r.exec.Ready(); ok {
		return false, nil
	}
	if n := r.exec.Queued(); n != 0 {
		return false, fmt.Errorf("bench: %s: the feed ended with %d txns queued that cannot run", r.name, n)
	}
	p := r.exec.Partition()
	rows := 0
	for _, t := range p.Tables() {
		rows += t.Len()
	}
	r.final = finalReport{last: r.exec.LastExecuted(), fence: r.fence, digest: p.Digest(), rows: rows}
	close(r.finalDone)
	return true, nil
}
