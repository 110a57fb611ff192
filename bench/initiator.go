package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/partition"
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

// initiator assigns txn IDs on the wall clock and sends every txn to every
// replica of the partition, as DESIGN.md's initiator does: the source
// from the start, the destination from the moment it joins the feed
// (DESIGN.md step 2). It writes upserts at a fixed offered rate (open
// loop: it does not wait for the source, so a source slowed by the rejoin
// shows as executing fewer txns per second than it is offered, not as a
// writer that politely slows down), and heartbeats in ticks without a txn
// so the replicas' safe txn ID keeps moving.
type initiator struct {
	gen   *txnid.Generator
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

func newInitiator(cfg RejoinConfig, shape *rowShape, toSource chan<- *batch, join <-chan chan<- *batch, stop <-chan struct{}) (*initiator, error) {
	gen, err := txnid.NewGenerator(benchInitiator, func() int64 { return time.Now().UnixMilli() })
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	in := &initiator{
		gen:       gen,
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
	return in, nil
}

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

// nextBatch makes n upserts, or a heartbeat if n is 0. Their params share
// one slab: one allocation per tick rather than one per txn.
func (in *initiator) nextBatch(n int) (*batch, error) {
	if n == 0 {
		return &batch{heartbeat: in.gen.Next()}, nil
	}
	b := &batch{txns: make([]partition.Invocation, n)}
	slab := make([]byte, 0, n*in.txnBytesMax)
	key := make([]byte, 0, in.shape.keyBytes)
	val := make([]byte, 0, in.shape.valueBytes)
	params := []wire.Value{wire.String(kvTable), {}, {}}
	for i := range b.txns {
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
		b.txns[i] = partition.Invocation{ID: in.gen.Next(), Proc: partition.ProcUpsert, Params: slab[at:len(slab):len(slab)]}
	}
	return b, nil
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
	return &batch{txns: []partition.Invocation{{ID: in.gen.Next(), Proc: partition.ProcRead, Params: params}}, end: true}, nil
}
