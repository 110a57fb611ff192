package recovery

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// TestPausedExecutorFencedByEtcdEpoch puts the real claims under the real
// processors. Executor A claims the rejoin in an embedded etcd and starts
// an attempt under the claim's epoch; mid-snapshot it freezes (its client,
// and so its lease keepalive, stop). After the TTL, executor B claims the
// same task at a higher epoch and starts a new attempt on the same source.
// When A wakes, its late messages reach B's processors, and both the
// source and the destination must reject every one by epoch; A's guard
// says it no longer holds the claim; B's rejoin completes with equal
// digests.
func TestPausedExecutorFencedByEtcdEpoch(t *testing.T) {
	defer goleak.VerifyNone(t)
	etcd, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Stop()
	cliA, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	cliB, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cliB.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	task := claim.Task{Partition: 3, Dest: "node-2"}
	const ttl, window = 2 * time.Second, 500 * time.Millisecond

	a, err := claim.Acquire(ctx, cliA, task, "host-a:1:aa", ttl, claim.WithWindow(window))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultSourceConfig(wire.MsgHeader{})
	cfg.Stream.BlockBytesMax = 256
	cfg.WindowBlocksMax = 2
	r := newInProcess(t, 11, 300, cfg)
	// The attempt runs under A's epoch (newInProcess starts epoch 7).
	hA := wire.MsgHeader{Epoch: a.Epoch(), Partition: 3}
	r.source.header, r.source.cfg.Header = hA, hA
	r.dest.header, r.dest.cfg.Header = hA, hA
	for i := 0; i < 5000 && !(r.dest.State() == StateStreaming && r.dest.applied >= 5); i++ {
		r.feed(true)
		r.stepSource(1)
		r.exchange()
	}
	if r.dest.State() != StateStreaming {
		t.Fatalf("attempt A never streamed: %s", r.dest.State())
	}
	oldSource, oldDest := r.source, r.dest
	oldDst := r.dst

	// A freezes: nothing of it runs, its keepalive stops with its client.
	if err := cliA.Close(); err != nil {
		t.Fatal(err)
	}
	var b *claim.Claim
	for deadline := time.Now().Add(3 * ttl); ; {
		b, err = claim.Acquire(ctx, cliB, task, "host-b:2:bb", ttl, claim.WithWindow(window))
		if err == nil {
			break
		}
		if !errors.Is(err, claim.ErrClaimed) || time.Now().After(deadline) {
			t.Fatalf("executor B could not claim after A froze: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer b.Release(context.Background())
	if b.Epoch() <= a.Epoch() {
		t.Fatalf("B's epoch %d not above A's %d", b.Epoch(), a.Epoch())
	}
	if a.Held(time.Now()) {
		t.Fatal("A's lease guard still holds after B claimed the task")
	}

	// B's attempt: the source node meets B's epoch and ends A's source (it
	// is superseded), then runs B's; B's destination is a fresh replica.
	hB := wire.MsgHeader{Epoch: b.Epoch(), Partition: 3}
	_ = oldSource.OnMessage(&wire.Heartbeat{MsgHeader: hB})
	if oldSource.State() != StateAborted || r.src.Gate() != nil {
		t.Fatalf("A's source not ended by B's epoch: %s, gate %v", oldSource.State(), r.src.Gate())
	}
	r.toDest, r.toSource = nil, nil // A's connection is gone with it
	scfg := cfg
	scfg.Header = hB
	if r.source, err = NewSource(r.src, scfg); err != nil {
		t.Fatal(err)
	}
	ins := []txnid.Initiator{1, 2} // newInProcess's initiators
	r.dst = newReplica(t, ins)
	if r.dest, err = NewDestination(r.dst, DestinationConfig{Header: hB, Initiators: ins, StallTicksMax: 50, HeartbeatTicks: 5}); err != nil {
		t.Fatal(err)
	}

	// A wakes: everything it had to say reaches B's processors.
	late := 0
	oldDest.Tick() // its first act on waking: a heartbeat, an ack
	for _, m := range append(oldDest.Outbox(), &wire.Ack{MsgHeader: hA, Seq: 1}, &wire.Propose{MsgHeader: hA, TxnID: 1}) {
		late++
		if err := r.source.OnMessage(m); !errors.Is(err, ErrStaleEpoch) {
			t.Fatalf("B's source accepted A's late %s: %v", m.Type(), err)
		}
	}
	for _, m := range append(oldSource.Outbox(), &wire.Answer{MsgHeader: hA, TxnID: 1}) {
		late++
		if err := r.dest.OnMessage(m); !errors.Is(err, ErrStaleEpoch) {
			t.Fatalf("B's destination accepted A's late %s: %v", m.Type(), err)
		}
	}
	if got := r.source.Metrics().StaleRejected + r.dest.Metrics().StaleRejected; got != int64(late) {
		t.Fatalf("%d late messages, %d rejected as stale", late, got)
	}
	// A learns it lost its claim and drops its partial replica.
	select {
	case <-a.Lost():
	case <-time.After(2 * window):
		t.Fatal("A not told of its lost claim within a window of waking")
	}
	oldDest.Abort(wire.AbortClaimLost, a.Err().Error())
	if n := oldDst.Partition().Tables()[0].Len(); n != 0 {
		t.Fatalf("A's aborted replica keeps %d rows", n)
	}

	// B's rejoin completes, and the replicas agree.
	for i := 0; i < 20000 && !r.dest.State().Final(); i++ {
		r.feed(true)
		r.stepSource(r.rng.IntN(3))
		if i%3 == 0 {
			r.source.Tick()
			r.dest.Tick()
		}
		r.exchange()
	}
	if r.dest.State() != StateLive {
		t.Fatalf("B's destination %s: %v", r.dest.State(), r.dest.Err())
	}
	r.settleAndCompare(11)
	_ = a.Release(context.Background()) // lost already: only its goroutines to end
}
