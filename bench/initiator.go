package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// benchInitiator is the partition's only initiator in the benchmark.
const benchInitiator txnid.Initiator = 1

// batch is what the initiator sends a replica in one tick: transactions in
// increasing ID order, or a heartbeat when it had none to send. Both
// replicas receive the same batch and only read it.
type batch struct {
	txns []partition.Invocation
	// heartbeat, if not Zero, follows the txns.
	heartbeat txnid.ID
	// end marks the last batch: its only txn is the fence, after which the
	// initiator sends nothing more.
	end bool
}

// initiator drives the product's initiator core (recovery.Initiator, the
// one recovery/node and the simulator drive): the core assigns txn IDs on
// the wall clock, heartbeats a tick with no txn, and sends every txn to
// every replica of the partition, as DESIGN.md's initiator does. Its
// feeds to the source node and the destination node are open from the
// start; the destination replica takes what comes from the moment it
// joins the feed (DESIGN.md step 2). It writes upserts at a fixed offered rate (open
// loop: it does not wait for the source, so a source slowed by the rejoin
// shows as executing fewer txns per second than it is offered, not as a
// writer that politely slows down), and heartbeats in ticks without a txn
// so the replicas' safe txn ID keeps moving.
type initiator struct {
	core  *recovery.Initiator
	view  *recovery.InitiatorView
	call  wire.Call // the one call being sequenced; the core keeps none
	cur   *batch    // what the core sends in this tick
	shape *rowShape
	rng   *rand.Rand
	enc   wire.TupleEncoder

	rate        int // upserts per second; 0: heartbeats only
	newKeyPct   int
	existing    uint64 // rows 0..existing-1 exist
	tickEvery   time.Duration
	txnBytesMax int // an upsert's encoded params, for the batch slab

	toSource chan<- *batch
	// join brings the destination's feed; stop asks for the fence and the
	// end of the feed.
	join <-chan chan<- *batch
	stop <-chan struct{}

	// offered counts the upserts sent, for the offered rate.
	offered atomic.Int64
}

// The bench's nodes, as the initiator core knows them.
const (
	sourceNode      = "source"
	destinationNode = "destination"
)

func newInitiator(cfg RejoinConfig, shape *rowShape, toSource chan<- *batch, join <-chan chan<- *batch, stop <-chan struct{}) (*initiator, error) {
	in := &initiator{
		view: &recovery.InitiatorView{Nodes: map[string]int64{sourceNode: 1, destinationNode: 1}, Bootstrapped: true,
			Placement: map[uint32][]recovery.ReplicaPlace{0: {{Node: sourceNode, Live: true}, {Node: destinationNode}}}},
		shape:     shape,
		rng:       rand.New(rand.NewPCG(cfg.Seed, 3)),
		newKeyPct: cfg.WriterNewKeyPercent,
		existing:  uint64(cfg.Rows),
		tickEvery: cfg.Tick,
		// array header, table name, two bin headers: 16 bytes is plenty.
		txnBytesMax: len(kvTable) + cfg.KeyBytes + cfg.ValueBytes + 16,
		toSource:    toSource,
		join:        join,
		stop:        stop,
	}
	if cfg.Writer {
		in.rate = cfg.WriterTxnsPerSec
	}
	core, err := recovery.NewInitiator(recovery.InitiatorConfig{Node: sourceNode, ID: benchInitiator, Partitions: 1, BeatTicks: 1,
		Clock: func() int64 { return time.Now().UnixMilli() }}, (*initiatorFeeds)(in))
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	in.core = core
	// Both feeds open at once: nothing ran yet, so the floors are zero.
	core.SetView(in.view)
	core.FeedOpened(sourceNode, txnid.Zero)
	core.FeedOpened(destinationNode, txnid.Zero)
	return in, nil
}

// initiatorFeeds is the core's I/O: what it sends to the source goes in
// the tick's batch, which the destination replica gets too once it has
// joined the feed. The feeds never break.
type initiatorFeeds initiator

func (f *initiatorFeeds) Send(node string, m wire.Message) bool {
	if node != sourceNode {
		return true // the same batch, sent to the destination by run
	}
	switch m := m.(type) {
	case *wire.Txn:
		f.cur.txns = append(f.cur.txns, partition.Invocation{ID: m.ID, Proc: m.Proc, Params: m.Params})
	case *wire.Beat:
		f.cur.heartbeat = m.ID
	}
	return true
}

// Dial is asked once per node, by the one view newInitiator gives the
// core, which then opens both feeds.
func (f *initiatorFeeds) Dial(string, recovery.DialAsk) {}

func (f *initiatorFeeds) Close(node string) { panic("bench: the initiator closed its feed to " + node) }

// run sends a batch every tick until stop, then the fence and the end.
// It returns nil when ctx ends: it was told to stop.
func (in *initiator) run(ctx context.Context) error {
	t := time.NewTicker(in.tickEvery)
	defer t.Stop()
	var toDest chan<- *batch
	start := time.Now()
	var issued int64
	// A tick may come late (a busy machine) and owe several ticks' txns;
	// more than a tenth of a second's worth is not owed: the initiator
	// fell behind its own rate and says so by having offered less.
	burstMax := max(1, int64(in.rate)/10)
	for {
		select {
		case <-ctx.Done():
			return nil
		case d := <-in.join:
			toDest = d
		case <-in.stop:
			b, err := in.fenceBatch()
			if err != nil {
				return err
			}
			if in.send(ctx, in.toSource, b) && toDest != nil {
				in.send(ctx, toDest, b)
			}
			return nil
		case <-t.C:
			// The clock read now, not the tick's time: a tick delivered
			// late may carry a time before the last one handled, and the
			// rate is owed up to now.
			due := int64(float64(in.rate)*time.Since(start).Seconds()) - issued
			switch {
			case due > burstMax:
				issued += due - burstMax
				due = burstMax
			case due < 0:
				due = 0
			}
			b, err := in.nextBatch(int(due))
			if err != nil {
				return err
			}
			issued += due
			in.offered.Add(due)
			if !in.send(ctx, in.toSource, b) {
				return nil
			}
			if toDest != nil && !in.send(ctx, toDest, b) {
				return nil
			}
		}
	}
}

func (in *initiator) send(ctx context.Context, to chan<- *batch, b *batch) bool {
	select {
	case to <- b:
		return true
	case <-ctx.Done():
		return false
	}
}

// nextBatch makes n upserts, or a heartbeat if n is 0 (the core's tick
// with nothing sent). Their params share one slab: one allocation per
// tick rather than one per txn.
func (in *initiator) nextBatch(n int) (*batch, error) {
	in.cur = &batch{}
	if n > 0 {
		in.cur.txns = make([]partition.Invocation, 0, n)
	}
	slab := make([]byte, 0, n*in.txnBytesMax)
	key := make([]byte, 0, in.shape.keyBytes)
	val := make([]byte, 0, in.shape.valueBytes)
	params := []wire.Value{wire.String(kvTable), {}, {}}
	for range n {
		// Most writes update an existing row, some insert a new one; the
		// new rows count as existing from then on.
		row := in.existing
		if in.rng.IntN(100) >= in.newKeyPct {
			row = in.rng.Uint64N(in.existing)
		} else {
			in.existing++
		}
		key = in.shape.key(key[:0], row)
		val = in.shape.value(val[:0], in.rng)
		params[1], params[2] = wire.Bytes(key), wire.Bytes(val)
		at := len(slab)
		var err error
		if slab, err = in.enc.AppendTuple(slab, params); err != nil {
			return nil, fmt.Errorf("bench: encode upsert: %w", err)
		}
		if err := in.submit(partition.ProcUpsert, slab[at:len(slab):len(slab)]); err != nil {
			return nil, err
		}
	}
	in.core.Tick()
	// The feeds never break: everything sent is there, and the feeds'
	// logs need keep nothing.
	in.core.FeedAcked(sourceNode, in.core.Last())
	in.core.FeedAcked(destinationNode, in.core.Last())
	return in.cur, nil
}

// submit sequences one txn of the workload into the tick's batch.
func (in *initiator) submit(proc string, params []byte) error {
	in.call = wire.Call{Proc: proc, Params: params}
	if err := in.core.Submit(in.view, true, &in.call, nil); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// fenceBatch is the last batch: one read of row 0, a txn that changes
// nothing, so that both replicas end at the same txn ID, the fence, even
// when the writer is off (with only heartbeats, the destination's last
// executed ID would be the handoff's E-1 and the source's none at all).
func (in *initiator) fenceBatch() (*batch, error) {
	params, err := in.enc.AppendTuple(nil, []wire.Value{wire.String(kvTable), wire.Bytes(in.shape.key(nil, 0))})
	if err != nil {
		return nil, fmt.Errorf("bench: encode fence: %w", err)
	}
	in.cur = &batch{end: true}
	if err := in.submit(partition.ProcRead, params); err != nil {
		return nil, err
	}
	return in.cur, nil
}
