package partition

import (
	"container/heap"
	"errors"
	"fmt"
	"slices"

	"github.com/rejoin-db/rejoin/txnid"
)

// Errors of the executor, classified with errors.Is. An arrival rejected by
// the executor changes nothing: not the queue, not the safe point.
var (
	// ErrQueueFull: the queue holds QueueTxnsMax transactions; the sender
	// must wait for execution to catch up.
	ErrQueueFull = errors.New("partition: executor queue full")
	// ErrTooLate: a txn at or below the last executed (or handed-off) txn ID
	// can no longer run in order.
	ErrTooLate = errors.New("partition: txn ID already passed")
)

// Invocation is one transaction as an initiator sends it to every replica
// of the partition. The initiator is the one named in the ID.
type Invocation struct {
	ID     txnid.ID
	Proc   string
	Params []byte // a tuple (wire.TupleEncoder)
}

// Result is what executing one Invocation produced. A procedure error is a
// result, not a failure of the executor: the txn ran, rolled back, and every
// replica reaches the same error.
type Result struct {
	ID  txnid.ID
	Out []byte // the result tuple; valid until the next Step
	Err error
}

// Gate decides, before each transaction, whether it may run now. The
// recovery source uses it to activate a table stream exactly at a txn
// boundary, to pace execution while its change log drains, and to hold the
// partition still for the handoff.
type Gate interface {
	// BeforeTxn is called with the ID of the next ready transaction, after
	// every txn below it has executed. Returning false holds execution:
	// Step runs nothing, and asks again on its next call.
	BeforeTxn(next txnid.ID) bool
}

// QueueTxnsMaxDefault bounds the executor's queue when the config gives no
// bound.
const QueueTxnsMaxDefault = 1 << 16

// ExecutorConfig sets the executor's limits.
type ExecutorConfig struct {
	// QueueTxnsMax bounds the transactions received and not yet executed.
	QueueTxnsMax int
}

// Executor runs the transactions of one partition replica one at a time in
// global txn-ID order. Transactions arrive from several initiators, each
// stream in increasing ID order and interleaved with heartbeats; a txn runs
// only once it is at or below the safe txn ID, when no initiator can still
// send anything smaller.
//
// It is deterministic and does no I/O: a driver feeds it with Offer and
// Heartbeat and calls Step. It is not safe for concurrent use; its owner
// serialises every call, and owns the partition with it.
type Executor struct {
	p       *Partition
	reg     *Registry
	tx      *Txn
	tracker *txnid.Tracker
	gate    Gate

	// queue holds the received, unexecuted transactions, smallest ID first.
	// Invariant: every ID in it is > last, and unique (each initiator's
	// stream strictly increases, and the initiator is part of the ID).
	queue    invocationHeap
	queueMax int
	// last is the highest txn ID executed, or handed off by ResetTo.
	last txnid.ID
	// safeTop is the highest safe txn ID the executor has read: a point it
	// may have run up to, or that a rejoin's boundary was set on
	// (recovery.Answer), so an initiator that joins later must send
	// nothing at or below it (SafeUpTo).
	safeTop txnid.ID

	out []byte
}

// NewExecutor returns an executor of p running procedures from reg.
func NewExecutor(p *Partition, reg *Registry, cfg ExecutorConfig) *Executor {
	if cfg.QueueTxnsMax <= 0 {
		cfg.QueueTxnsMax = QueueTxnsMaxDefault
	}
	return &Executor{
		p:        p,
		reg:      reg,
		tx:       NewTxn(p),
		tracker:  txnid.NewTracker(),
		queueMax: cfg.QueueTxnsMax,
	}
}

// Partition returns the partition the executor runs on.
func (e *Executor) Partition() *Partition { return e.p }

// SetGate installs g (nil removes it).
func (e *Executor) SetGate(g Gate) { e.gate = g }

// Gate returns the installed gate, or nil: a check that a finished rejoin
// left the executor free.
func (e *Executor) Gate() Gate { return e.gate }

// AddInitiator starts tracking an initiator. Until it sends something, the
// safe txn ID stays at Zero and nothing executes: its first txn could be
// smaller than anything queued.
func (e *Executor) AddInitiator(in txnid.Initiator) { e.tracker.Add(in) }

// AddInitiatorAbove starts tracking an initiator known to send nothing at
// or below floor: the safe txn ID does not fall below floor for it, and a
// txn of it at or below floor is refused.
func (e *Executor) AddInitiatorAbove(in txnid.Initiator, floor txnid.ID) {
	e.tracker.AddAbove(in, floor)
}

// RemoveInitiator stops waiting for an initiator (it failed or left).
// Transactions it already sent stay queued and execute in order.
func (e *Executor) RemoveInitiator(in txnid.Initiator) { e.tracker.Remove(in) }

// Initiators returns, in increasing order, the initiators whose txns the
// executor may still run: those it tracks, and those with a txn queued
// (removed with txns still to run). A rejoin's source names them in its
// handoff, so the destination can check it holds their txns from E on.
func (e *Executor) Initiators() []txnid.Initiator {
	out := e.tracker.Initiators()
	for i := range e.queue {
		in := e.queue[i].ID.Initiator()
		if !slices.Contains(out, in) {
			out = append(out, in)
		}
	}
	slices.Sort(out)
	return out
}

// Offer queues a transaction from the initiator named in its ID.
func (e *Executor) Offer(inv Invocation) error {
	if len(e.queue) >= e.queueMax {
		return fmt.Errorf("%w: %d txns", ErrQueueFull, len(e.queue))
	}
	if inv.ID <= e.last {
		return fmt.Errorf("%w: txn %v, last executed %v", ErrTooLate, inv.ID, e.last)
	}
	if err := e.tracker.Observe(inv.ID.Initiator(), inv.ID); err != nil {
		return fmt.Errorf("partition: offer txn %v: %w", inv.ID, err)
	}
	heap.Push(&e.queue, inv)
	return nil
}

// Heartbeat records that the initiator named in id will send nothing at
// or below id, which may let queued transactions run.
func (e *Executor) Heartbeat(id txnid.ID) error {
	if err := e.tracker.Observe(id.Initiator(), id); err != nil {
		return fmt.Errorf("partition: heartbeat %v: %w", id, err)
	}
	return nil
}

// Safe returns the safe txn ID: nothing at or below it can still arrive.
func (e *Executor) Safe() (txnid.ID, bool) { return e.safe() }

// PeekSafe returns the safe txn ID as Safe does, without keeping it as
// read (SafeUpTo): for a look nothing is decided on, such as a driver's
// measurement, which must not move a joining initiator's floor.
func (e *Executor) PeekSafe() (txnid.ID, bool) { return e.tracker.Safe() }

// safe reads the tracker's safe txn ID and keeps the highest read.
func (e *Executor) safe() (txnid.ID, bool) {
	s, ok := e.tracker.Safe()
	if ok && s > e.safeTop {
		e.safeTop = s
	}
	return s, ok
}

// LastFrom returns the highest ID tracked from initiator in, a txn, a
// heartbeat or the floor it was added above; ok is false if in is not
// tracked.
func (e *Executor) LastFrom(in txnid.Initiator) (txnid.ID, bool) { return e.tracker.Last(in) }

// SafeUpTo returns the highest txn ID the executor executed or read as
// safe: a floor for an initiator that joins (its IDs must start above
// it). It never goes down, though Safe() does when an initiator is
// added: the points already read as safe were relied on.
func (e *Executor) SafeUpTo() txnid.ID { return max(e.last, e.safeTop) }

// LastExecuted returns the highest txn ID executed or handed off (Zero if
// none).
func (e *Executor) LastExecuted() txnid.ID { return e.last }

// Queued returns the number of received, unexecuted transactions.
func (e *Executor) Queued() int { return len(e.queue) }

// Ready returns the ID of the next transaction if it may run now (the gate
// aside): it is the smallest queued and at or below the safe txn ID.
func (e *Executor) Ready() (txnid.ID, bool) {
	if len(e.queue) == 0 {
		return 0, false
	}
	safe, ok := e.safe()
	next := e.queue[0].ID
	if !ok || next > safe {
		return 0, false
	}
	return next, true
}

// QueuedFrom returns the smallest queued txn ID at or above p: the answer
// a recovery source gives to a proposal of p when a txn is waiting.
func (e *Executor) QueuedFrom(p txnid.ID) (txnid.ID, bool) {
	var best txnid.ID
	found := false
	for i := range e.queue {
		if id := e.queue[i].ID; id >= p && (!found || id < best) {
			best, found = id, true
		}
	}
	return best, found
}

// Step runs the next ready transaction, if there is one and the gate lets
// it, and reports whether it ran.
func (e *Executor) Step() (Result, bool) {
	next, ok := e.Ready()
	if !ok {
		return Result{}, false
	}
	if e.gate != nil && !e.gate.BeforeTxn(next) {
		return Result{}, false
	}
	inv := heap.Pop(&e.queue).(Invocation)
	if inv.ID <= e.last {
		panic(fmt.Sprintf("partition: executor order broken: txn %v after %v", inv.ID, e.last))
	}
	e.last = inv.ID
	out, err := e.reg.Run(e.tx, inv.Proc, inv.Params, e.out[:0])
	e.out = out
	checkDigest(e.p)
	return Result{ID: inv.ID, Out: out, Err: err}, true
}

// ResetTo makes e continue at txn E after the partition's content was
// brought to the state after every txn < E by other means (a rejoin's
// handoff): queued transactions below E are dropped, and nothing below E is
// accepted from now on. It returns how many were dropped.
func (e *Executor) ResetTo(E txnid.ID) int {
	if E == txnid.Zero {
		return 0
	}
	dropped := 0
	for len(e.queue) > 0 && e.queue[0].ID < E {
		heap.Pop(&e.queue)
		dropped++
	}
	if E-1 > e.last {
		e.last = E - 1
	}
	return dropped
}

// invocationHeap is a min-heap of invocations by txn ID.
type invocationHeap []Invocation

func (h invocationHeap) Len() int           { return len(h) }
func (h invocationHeap) Less(i, j int) bool { return h[i].ID < h[j].ID }
func (h invocationHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *invocationHeap) Push(x any)        { *h = append(*h, x.(Invocation)) }
func (h *invocationHeap) Pop() any {
	old := *h
	n := len(old)
	x := old[n-1]
	old[n-1] = Invocation{} // let the params be collected
	*h = old[:n-1]
	return x
}
