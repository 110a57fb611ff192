package node

import (
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// beatReplica returns a replica of partition p, live or needing a rejoin,
// that tracks initiators 1 and 2 with their heartbeats in the slots
// returned, and the channel its txns' results go to, in the order they
// ran (both initiators' feeds are the same fake feed here). Its loop is
// not started.
func beatReplica(t *testing.T, n *Node, p uint32, live bool) (*replica, map[txnid.Initiator]*beatSlot, chan wire.Message) {
	t.Helper()
	if n.cli == nil {
		// A replica that fails publishes its state in etcd, here one
		// that never answers: the tests read the replica's state.
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		n.cli, n.unpub = cli, map[uint32]bool{}
	}
	r, err := newReplica(n, p, live)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan wire.Message, 1<<16)
	slots := map[txnid.Initiator]*beatSlot{1: {}, 2: {}}
	n.feeds.mu.Lock()
	if n.feeds.by == nil {
		n.feeds.by = map[txnid.Initiator]*feedIn{}
	}
	for in := range slots {
		n.feeds.by[in] = &feedIn{in: in, q: done}
	}
	n.feeds.mu.Unlock()
	for in, s := range slots {
		r.addInitiator(in, 1, s)
	}
	return r, slots, done
}

func testTxn(id txnid.ID) event {
	return txnEvent(partition.Invocation{ID: id, Proc: "noop"})
}

// ran returns the IDs of the results in done so far.
func ranIDs(done chan wire.Message) []txnid.ID {
	var ids []txnid.ID
	for {
		select {
		case m := <-done:
			ids = append(ids, m.(*wire.Done).ID)
		default:
			return ids
		}
	}
}

// TestBeatSlotWaitsForEarlierTxns is the ordering hazard of heartbeat
// slots, step by step as the replica's loop runs them. A's txn a waits for
// B. B's feed reader puts B's txn b (below a) into the inbox and then
// raises B's slot past a. The loop reads the slot before it takes b: had
// it applied the value at once, a would run before b, which then comes
// too late and the replica fails (or, on another replica that took b
// first, runs in the other order: divergence). The value waits for the
// events queued before it was read.
func TestBeatSlotWaitsForEarlierTxns(t *testing.T) {
	n := testNode(t, t.TempDir())
	r, slots, done := beatReplica(t, n, 1, true)
	a, b := txnid.Make(100, 0, 1), txnid.Make(90, 0, 2)
	r.run(testTxn(a))
	if r.step() {
		t.Fatal("a ran before B spoke")
	}
	// B's feed reader.
	r.in <- testTxn(b)
	slots[2].raise(txnid.Make(110, 0, 2))
	// The loop, before it takes b.
	if !r.maybePullBeats() {
		t.Fatal("B's slot not read")
	}
	r.step()
	for len(r.in) > 0 {
		r.run(<-r.in)
	}
	r.step()
	if st := r.core.State(); st != recovery.ReplicaLive {
		t.Fatalf("replica %v after a heartbeat read ahead of B's txn", st)
	}
	if got, want := ranIDs(done), []txnid.ID{b, a}; !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
}

// TestBeatSlotTwoFeedsInterleaved: two feed readers send txns and
// heartbeats concurrently to a running replica, each heartbeat just above
// its txn, so the slots keep moving while the other initiator's txns wait
// in the inbox. Every txn runs, in ID order, and the replica stays live.
func TestBeatSlotTwoFeedsInterleaved(t *testing.T) {
	n := testNode(t, t.TempDir())
	r, slots, done := beatReplica(t, n, 1, true)
	n.goRun(r.loop)
	const each = 3000
	var wg sync.WaitGroup
	for in := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range each {
				// The same milliseconds on both feeds: their txns
				// interleave by ID.
				if !r.do(testTxn(txnid.Make(int64(1000+2*j), 0, in))) {
					return
				}
				slots[in].raise(txnid.Make(int64(1001+2*j), 0, in))
				n.feeds.waiters.wake()
			}
		}()
	}
	wg.Wait()
	var ran []txnid.ID
	deadline := time.Now().Add(30 * time.Second)
	state := func() recovery.ReplicaState {
		st, _ := ask(r, func(r *replica) recovery.ReplicaState { return r.core.State() })
		return st
	}
	for len(ran) < 2*each && time.Now().Before(deadline) {
		select {
		case m := <-done:
			ran = append(ran, m.(*wire.Done).ID)
		case <-time.After(100 * time.Millisecond):
			if state() != recovery.ReplicaLive {
				deadline = time.Now()
			}
		}
	}
	st := state()
	if st != recovery.ReplicaLive {
		t.Fatalf("replica %v", st)
	}
	if len(ran) != 2*each || !slices.IsSorted(ran) {
		t.Fatalf("ran %d of %d txns, in order: %v", len(ran), 2*each, slices.IsSorted(ran))
	}
}

// TestIdleReplicaReadsSlotOnTxn: a heartbeat that came while the replica
// was idle woke nothing, but the txn that comes next finds it in the slot
// and runs without waiting for another heartbeat. A txn above every
// heartbeat waits, armed, and the next heartbeat wakes it.
func TestIdleReplicaReadsSlotOnTxn(t *testing.T) {
	n := testNode(t, t.TempDir())
	r, slots, done := beatReplica(t, n, 1, true)
	n.goRun(r.loop)
	slots[2].raise(txnid.Make(110, 0, 2))
	n.feeds.waiters.wake()
	a := txnid.Make(100, 0, 1)
	r.do(testTxn(a))
	var ran []txnid.ID
	waitUntil(t, 10*time.Second, "txn a to run on the heartbeat already in the slot", func() bool {
		ran = append(ran, ranIDs(done)...)
		return len(ran) == 1
	})
	if r.wakes.Load() != 0 {
		t.Fatalf("%d wake-ups for a replica that waited for no heartbeat", r.wakes.Load())
	}

	a2 := txnid.Make(200, 0, 1)
	r.do(testTxn(a2))
	waitUntil(t, 10*time.Second, "the replica to wait for a heartbeat", func() bool { return r.armed.Load() })
	if got := ranIDs(done); len(got) != 0 {
		t.Fatalf("ran %v before B passed it", got)
	}
	slots[2].raise(txnid.Make(210, 0, 2))
	n.feeds.waiters.wake()
	waitUntil(t, 10*time.Second, "txn a2 to run on B's heartbeat", func() bool {
		ran = append(ran, ranIDs(done)...)
		return len(ran) == 2
	})
	if !slices.Equal(ran, []txnid.ID{a, a2}) {
		t.Fatalf("ran %v", ran)
	}
}

// TestIdleReplicasNotWoken: a heartbeat wakes only the replicas waiting
// for one. Of 32 idle replicas and one with a txn waiting, only the one
// waiting is woken, however many heartbeats come.
func TestIdleReplicasNotWoken(t *testing.T) {
	n := testNode(t, t.TempDir())
	var idle []*replica
	for p := range uint32(32) {
		r, _, _ := beatReplica(t, n, p, true)
		idle = append(idle, r)
		n.goRun(r.loop)
	}
	w, slots, done := beatReplica(t, n, 99, true)
	n.goRun(w.loop)
	w.do(testTxn(txnid.Make(100, 0, 1)))
	waitUntil(t, 10*time.Second, "the replica with a txn to wait for a heartbeat", func() bool { return w.armed.Load() })
	for i := range 200 {
		// Below the txn: it keeps waiting.
		slots[2].raise(txnid.Make(int64(i+1), 0, 2))
		n.feeds.waiters.wake()
		time.Sleep(time.Millisecond)
	}
	waitUntil(t, 10*time.Second, "the waiting replica woken", func() bool { return w.wakes.Load() > 0 })
	for _, r := range idle {
		if got := r.wakes.Load(); got != 0 {
			t.Errorf("idle replica %d woken %d times", r.p, got)
		}
		if r.armed.Load() {
			t.Errorf("idle replica %d waits for a heartbeat", r.p)
		}
	}
	slots[2].raise(txnid.Make(300, 0, 2))
	n.feeds.waiters.wake()
	waitUntil(t, 10*time.Second, "the txn to run", func() bool { return len(ranIDs(done)) == 1 })
}

// TestRemovedInitiatorSlotNotRead: once an initiator is removed (its feed
// ended and its tail is settled), its slot is no longer read: a value in
// it is not a heartbeat of an initiator the replica tracks, and applied
// it would fail the replica. A's txn, waiting for B and C, runs once C
// passes it.
func TestRemovedInitiatorSlotNotRead(t *testing.T) {
	n := testNode(t, t.TempDir())
	r, slots, done := beatReplica(t, n, 1, true)
	c := &beatSlot{}
	r.addInitiator(3, 1, c)
	n.goRun(r.loop)
	r.do(testTxn(txnid.Make(100, 0, 1)))
	waitUntil(t, 10*time.Second, "A's txn to wait", func() bool { return r.armed.Load() })
	// B's last heartbeat, stored before its removal and read after.
	r.do(func(r *replica) {
		slots[2].raise(txnid.Make(500, 0, 2))
		r.removeInitiator(2)
	})
	c.raise(txnid.Make(110, 0, 3))
	n.feeds.waiters.wake()
	waitUntil(t, 10*time.Second, "A's txn to run", func() bool { return len(ranIDs(done)) == 1 })
	st, _ := ask(r, func(r *replica) recovery.ReplicaState { return r.core.State() })
	if st != recovery.ReplicaLive {
		t.Fatalf("replica %v", st)
	}
}

// TestNewIncarnationSlotFresh: a new process of initiator B has a feed,
// and a slot, of its own. What B's old process promised says nothing of
// the new one, whose IDs start above the replicas' floor, not above the
// old heartbeats: A's txn waits for the new process to speak, and runs
// after the new process's txn below it.
func TestNewIncarnationSlotFresh(t *testing.T) {
	n := testNode(t, t.TempDir())
	r, slots, done := beatReplica(t, n, 1, true)
	n.goRun(r.loop)
	slots[2].raise(txnid.Make(500, 0, 2))
	fresh := &beatSlot{}
	r.do(func(r *replica) {
		r.removeInitiator(2)
		r.addInitiator(2, 2, fresh)
	})
	a := txnid.Make(300, 0, 1)
	r.do(testTxn(a))
	waitUntil(t, 10*time.Second, "the replica to wait for B's new process, or run", func() bool { return r.armed.Load() || len(done) > 0 })
	time.Sleep(50 * time.Millisecond)
	if got := ranIDs(done); len(got) != 0 {
		t.Fatalf("ran %v on the old process's heartbeat", got)
	}
	b := txnid.Make(200, 0, 2)
	r.do(testTxn(b))
	fresh.raise(txnid.Make(310, 0, 2))
	n.feeds.waiters.wake()
	var ran []txnid.ID
	waitUntil(t, 10*time.Second, "both txns to run", func() bool {
		ran = append(ran, ranIDs(done)...)
		return len(ran) == 2
	})
	if !slices.Equal(ran, []txnid.ID{b, a}) {
		t.Fatalf("ran %v", ran)
	}
}

// TestDestinationIgnoresOlderSlot: a destination attempt hears from an
// initiator only what it sent after the attempt began: the first ID it
// hears from each says that it buffers all that initiator's txns above
// it (recovery.Coverage). A heartbeat in the slot from before the start
// may have txns after it that the replica dropped, having no attempt then;
// read as the first ID heard, it would let the attempt propose a point it
// does not hold every txn from. So the attempt proposes only once both
// initiators beat again.
func TestDestinationIgnoresOlderSlot(t *testing.T) {
	n := testNode(t, t.TempDir())
	r, slots, _ := beatReplica(t, n, 1, false)
	n.goRun(r.loop)
	// Before the attempt: B's heartbeat, then B's txn above it, dropped
	// (nothing to buffer it), and A's heartbeat.
	slots[2].raise(txnid.Make(90, 0, 2))
	r.do(testTxn(txnid.Make(100, 0, 2)))
	slots[1].raise(txnid.Make(90, 0, 1))
	state := func() recovery.State {
		s, _ := ask(r, func(r *replica) recovery.State { return r.core.Destination().State() })
		return s
	}
	if err, ok := ask(r, func(r *replica) error { _, err := r.startDest("n1", 7); return err }); !ok || err != nil {
		t.Fatalf("startDest: %v (run: %v)", err, ok)
	}
	time.Sleep(100 * time.Millisecond)
	if s := state(); s != recovery.StateBuffering {
		t.Fatalf("destination %v on heartbeats from before its start", s)
	}
	slots[1].raise(txnid.Make(120, 0, 1))
	slots[2].raise(txnid.Make(120, 0, 2))
	n.feeds.waiters.wake()
	waitUntil(t, 10*time.Second, "the proposal", func() bool { return state() != recovery.StateBuffering })
}

// TestOlderFeedNotBoundLate: a replica created while feeds run tracks
// them (trackFeeds), and may be told of a feed after a newer process of
// the same initiator opened its own. The older feed's slot does not
// replace the newer's: the replica reads the newer process's heartbeats.
func TestOlderFeedNotBoundLate(t *testing.T) {
	n := testNode(t, t.TempDir())
	r, _, done := beatReplica(t, n, 1, true)
	newer, older := &beatSlot{}, &beatSlot{}
	r.removeInitiator(2)
	r.addInitiator(2, 5, newer)
	r.addInitiator(2, 4, older)
	n.goRun(r.loop)
	r.do(testTxn(txnid.Make(100, 0, 1)))
	waitUntil(t, 10*time.Second, "A's txn to wait", func() bool { return r.armed.Load() })
	newer.raise(txnid.Make(110, 0, 2))
	n.feeds.waiters.wake()
	waitUntil(t, 10*time.Second, "A's txn to run on the newer process's heartbeat", func() bool { return len(ranIDs(done)) == 1 })
}
