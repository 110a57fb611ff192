package recovery

import (
	"errors"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// holds counts the Hold messages in msgs.
func holds(msgs []wire.Message) int {
	n := 0
	for _, m := range msgs {
		if _, ok := m.(*wire.Hold); ok {
			n++
		}
	}
	return n
}

// TestDestinationBufferBytesMax: the destination's buffer is bounded in
// bytes, not only in txns. Past the hold mark it asks the source to hold
// (once); a txn that would take it past BufferBytesMax is refused, not
// buffered, and the attempt ends as overloaded rather than grow.
func TestDestinationBufferBytesMax(t *testing.T) {
	const (
		holdMark = 8 << 10
		bytesMax = 16 << 10
		params   = 200
	)
	ins := []txnid.Initiator{1}
	exec := newReplica(t, ins)
	d, err := NewDestination(exec, DestinationConfig{
		Header: wire.MsgHeader{Epoch: 3, Partition: 1}, Initiators: ins, StallTicksMax: 50, HeartbeatTicks: 5,
		BufferBytesMax: bytesMax, BufferHoldBytes: holdMark,
	})
	if err != nil {
		t.Fatal(err)
	}
	now := txnid.EpochUnixMillis + 5000
	gen, err := txnid.NewGenerator(1, func() int64 { return now })
	if err != nil {
		t.Fatal(err)
	}
	cost := int64(params + len(partition.ProcUpsert) + TxnOverheadBytes)
	var buffered int64
	held := false
	for i := range 1000 {
		inv := partition.Invocation{ID: gen.Next(), Proc: partition.ProcUpsert, Params: make([]byte, params)}
		err := d.OnTxn(inv)
		n := holds(d.Outbox())
		if buffered+cost > bytesMax {
			if !errors.Is(err, ErrBufferFull) {
				t.Fatalf("txn %d: %d bytes buffered of %d, %d more accepted (err %v): the buffer grows past its bound", i, buffered, bytesMax, cost, err)
			}
			var ae *AbortError
			if d.State() != StateAborted || !errors.As(d.Err(), &ae) || ae.Reason != wire.AbortOverload {
				t.Fatalf("after the refusal: state %s, err %v; want aborted as overloaded", d.State(), d.Err())
			}
			if q := exec.Queued(); int64(q)*cost != buffered {
				t.Fatalf("executor holds %d txns, want %d: the refused txn was queued", q, buffered/cost)
			}
			if !held {
				t.Fatal("the buffer filled without a hold sent")
			}
			return
		}
		if err != nil {
			t.Fatalf("txn %d with %d bytes buffered of %d: %v", i, buffered, bytesMax, err)
		}
		buffered += cost
		switch {
		case n > 1 || (n == 1 && held):
			t.Fatalf("txn %d: a second hold sent", i)
		case n == 1 && buffered <= holdMark:
			t.Fatalf("txn %d: hold sent at %d bytes, below the mark %d", i, buffered, holdMark)
		case n == 0 && !held && buffered > holdMark:
			t.Fatalf("txn %d: %d bytes buffered, past the mark %d, and no hold sent", i, buffered, holdMark)
		}
		held = held || n == 1
		if got := d.Metrics().BufferBytesPeak; got != buffered {
			t.Fatalf("txn %d: BufferBytesPeak %d, want %d", i, got, buffered)
		}
	}
	t.Fatalf("1000 txns of %d bytes buffered under BufferBytesMax %d", cost, bytesMax)
}

// TestSourceHoldsForDestination: a rejoin whose partition keeps being
// written while a long snapshot streams. Writers have a bounded number of
// calls in flight, as clients have on a node: a write waits for the
// source to execute it. Once the destination's buffer passes its mark,
// the source holds execution, the writes stop, and the rejoin ends live
// and equal with the buffer within its bound; without the hold the
// buffer runs past its bound and the attempt aborts.
func TestSourceHoldsForDestination(t *testing.T) {
	const inflight = 32 // txns offered to the source and not executed yet
	cfg := DefaultSourceConfig(wire.MsgHeader{})
	cfg.Stream.BlockBytesMax = 256 // a snapshot of many blocks: a long rejoin
	cfg.WindowBlocksMax = 2
	r := newInProcess(t, 11, 6000, cfg)
	// The feed's txns have at most ~110 bytes of params: the room past
	// the mark takes every txn in flight when the hold begins.
	txnMax := int64(128 + len(partition.ProcIncrement) + TxnOverheadBytes)
	dcfg := DestinationConfig{
		Header: wire.MsgHeader{Epoch: 7, Partition: 3}, Initiators: []txnid.Initiator{1, 2}, StallTicksMax: 50, HeartbeatTicks: 5,
		BufferHoldBytes: 8 << 10,
		BufferBytesMax:  8<<10 + (inflight+1)*txnMax,
	}
	var err error
	if r.dest, err = NewDestination(r.dst, dcfg); err != nil {
		t.Fatal(err)
	}
	// Until both have ended: the source is done with the HandoffAck.
	// HoldsPartition says when the source holds its replica: under the
	// hold, and in the handoff's pause (a driver whose connection broke
	// gives the attempt up rather than hold on).
	sawHold, sawPause := false, false
	for i := 0; i < 200000 && !(r.dest.State().Final() && r.source.State().Final()); i++ {
		if r.src.Queued() < inflight {
			r.feed(true)
		}
		if r.source.HoldsPartition() {
			sawHold = sawHold || r.source.State() != StateHandingOff
			sawPause = sawPause || r.source.State() == StateHandingOff
		}
		r.stepSource(1 + r.rng.IntN(3))
		if i%3 == 0 {
			r.source.Tick()
			r.dest.Tick()
		}
		r.exchange()
	}
	dm, sm := r.dest.Metrics(), r.source.Metrics()
	t.Logf("buffer peak %d bytes (mark %d, max %d); source held %d ticks for the destination; %d rows streamed", dm.BufferBytesPeak, dcfg.BufferHoldBytes, dcfg.BufferBytesMax, sm.PeerHoldTicks, sm.Snapshot.Rows)
	if r.dest.State() != StateLive || r.source.State() != StateDone {
		t.Fatalf("destination %s (%v), source %s (%v)", r.dest.State(), r.dest.Err(), r.source.State(), r.source.Err())
	}
	if dm.BufferBytesPeak > dcfg.BufferBytesMax || dm.BufferBytesPeak <= dcfg.BufferHoldBytes {
		t.Fatalf("buffer peak %d, want past the mark %d and within %d", dm.BufferBytesPeak, dcfg.BufferHoldBytes, dcfg.BufferBytesMax)
	}
	if sm.PeerHoldTicks == 0 {
		t.Fatal("the source never held for the destination")
	}
	if !sawHold || r.source.HoldsPartition() {
		t.Fatalf("HoldsPartition: seen under the hold %v, after the end %v; want true, then false", sawHold, r.source.HoldsPartition())
	}
	t.Logf("HoldsPartition seen in the handoff's pause: %v", sawPause)
	drainExec(r.src)
	drainExec(r.dst)
	if r.src.LastExecuted() != r.dst.LastExecuted() {
		t.Fatalf("source at %v, destination at %v", r.src.LastExecuted(), r.dst.LastExecuted())
	}
	if a, b := r.src.Partition().Digest(), r.dst.Partition().Digest(); a != b {
		t.Fatalf("digests differ at %v: %x vs %x", r.src.LastExecuted(), a, b)
	}
}

// TestDestinationResumeResendsHold: a hold may be lost with a broken
// connection; Resume sends it again, in every state before the handoff.
func TestDestinationResumeResendsHold(t *testing.T) {
	ins := []txnid.Initiator{1, 2}
	exec := newReplica(t, ins)
	d, err := NewDestination(exec, DestinationConfig{
		Header: wire.MsgHeader{Epoch: 3, Partition: 1}, Initiators: ins, StallTicksMax: 50, HeartbeatTicks: 5,
		BufferBytesMax: 1 << 20, BufferHoldBytes: 1000,
	})
	if err != nil {
		t.Fatal(err)
	}
	now := txnid.EpochUnixMillis + 5000
	gen, err := txnid.NewGenerator(1, func() int64 { return now })
	if err != nil {
		t.Fatal(err)
	}
	// Initiator 2 is not heard yet: the destination still buffers.
	for range 10 {
		if err := d.OnTxn(partition.Invocation{ID: gen.Next(), Proc: partition.ProcUpsert, Params: make([]byte, 200)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := holds(d.Outbox()); d.State() != StateBuffering || n != 1 {
		t.Fatalf("state %s, %d holds sent; want buffering and one", d.State(), n)
	}
	d.Resume()
	if n := holds(d.Outbox()); n != 1 {
		t.Fatalf("resume while buffering sent %d holds, want 1", n)
	}
	gen2, err := txnid.NewGenerator(2, func() int64 { return now })
	if err != nil {
		t.Fatal(err)
	}
	if err := d.OnHeartbeat(gen2.Next()); err != nil {
		t.Fatal(err)
	}
	if d.State() != StateProposing {
		t.Fatalf("state %s, want proposing", d.State())
	}
	d.Outbox()
	d.Resume()
	if n := holds(d.Outbox()); n != 1 {
		t.Fatalf("resume while proposing sent %d holds, want 1", n)
	}
}
