package node

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// TestQuickRestartDuringTailRepair: an initiator's node stops with a txn
// that reached one survivor and not the other, and is back (a new
// process, a new feed) while the survivors are still repairing its old
// feed's tail. The repair must still end with both survivors holding the
// txn and neither failing: the peer answers for the old process's feed
// though the new one is open, and the new feed is taken in only after
// the old tail is settled, so the initiator's re-added sequence is never
// removed under it. Before, the repair failed ("the feed from initiator
// 3 is still open here") or the new feed's heartbeats were refused
// ("unknown initiator"), and the survivors' replicas failed together.
func TestQuickRestartDuringTailRepair(t *testing.T) {
	cfg := layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	c := newClusterStarting(t, 3, 0, cfg)
	slowRepair := func(cfg *Config) {
		cfg.NodeTTL = 2 * time.Second
		cfg.knobs.repairDelay = 1500 * time.Millisecond
	}
	c.startCfg(1, slowRepair)
	c.startCfg(2, slowRepair)
	var mu sync.Mutex
	var torn txnid.ID
	armed := false
	skip := func(node string, id txnid.ID) bool {
		mu.Lock()
		defer mu.Unlock()
		if armed && node == NodeName(2) {
			if torn == 0 {
				torn = id
			}
			return true
		}
		return false
	}
	a3 := c.startCfg(3, func(cfg *Config) { cfg.NodeTTL = 2 * time.Second; cfg.knobs.skip = skip })
	cl3 := dialClient(t, a3.TCP)
	waitWritable(t, cl3, 1)
	for i := range 100 {
		upsert(t, cl3, 1, i)
	}
	mu.Lock()
	armed = true
	mu.Unlock()
	upsert(t, cl3, 1, 1_000_000)
	mu.Lock()
	id := torn
	mu.Unlock()
	if id == 0 {
		t.Fatal("the hook never tore a txn")
	}
	// Back at once: the survivors' repair of the old feed is held for
	// 1.5 s, so the new process's feeds open while it is under way.
	c.stop(3)
	c.startCfg(3, func(cfg *Config) { cfg.NodeTTL = 2 * time.Second })
	cl1 := dialClient(t, c.nodes[1].addrs.TCP)
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	for i := 100; i < 200; i++ {
		upsert(t, cl1, 1, i)
	}
	// A survivor that failed would rejoin and be live again later: watch
	// past the repair's retries (3 node TTLs) that neither ever rejoined.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		for _, id := range []int{1, 2} {
			st := nodeStatus(t, c.nodes[id].addrs)
			if r := st.Replicas[0]; r.State != recovery.ReplicaLive || r.Rejoin != nil {
				t.Fatalf("survivor n%d's replica: state %s, rejoin %+v", id, r.State, r.Rejoin)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	r, err := cl1.call(0, partition.ProcDigest, true)
	if err != nil || len(r.Each) != 3 {
		t.Fatalf("digest: %v, %d replicas", err, len(r.Each))
	}
	checkDigests(t, cl1, 1, 3)
}

// TestFirstStartAfterWrites: a node of the placement that has never run
// would come up with its replicas live and empty. So no call is taken
// before every node of the placement has started once; before, a write
// taken by n1 and n2 was missing on n3's replica, live from its first
// start, and the digests differed.
func TestFirstStartAfterWrites(t *testing.T) {
	cfg := layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	c := newClusterStarting(t, 3, 2, cfg)
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	key := wire.Bytes([]byte("early"))
	_, err := cl.call(0, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes([]byte("v")))
	if err == nil {
		t.Log("a write was taken before n3 ever started")
	} else if !strings.Contains(err.Error(), "not bootstrapped") {
		t.Fatalf("early write: %v", err)
	}
	c.start(3)
	waitWritable(t, cl, 1)
	for i := range 50 {
		upsert(t, cl, 1, i)
	}
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	checkDigests(t, cl, 1, 3)
}

// TestFirstStartSlowToRegister: the last node of the placement records
// its first incarnation, then takes a while to register. The cluster is
// not bootstrapped until it has registered: a write taken in between
// would not reach its replicas, which start live. Before, the others
// counted the cluster bootstrapped from the incarnation alone and wrote
// without n3 (TestFirstStartAfterWrites failed 1 run in 6 so).
func TestFirstStartSlowToRegister(t *testing.T) {
	cfg := layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	c := newClusterStarting(t, 3, 2, cfg)
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	started := make(chan struct{})
	go func() {
		defer close(started)
		c.startCfg(3, func(cfg *Config) { cfg.knobs.beforeRegister = 3 * time.Second })
	}()
	// Writes all through n3's slow start: each must be refused, or reach
	// n3's replica.
	i := 0
	for {
		select {
		case <-started:
		default:
			key := wire.Bytes(fmt.Appendf(nil, "key-%06d", i))
			_, _ = cl.call(0, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes([]byte("v")))
			i++
			time.Sleep(20 * time.Millisecond)
			continue
		}
		break
	}
	if t.Failed() {
		return
	}
	waitWritable(t, cl, 1)
	upsert(t, cl, 1, 1_000_000)
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	waitUntil(t, 5*time.Second, "every replica answering", func() bool {
		r, err := cl.call(0, partition.ProcDigest, true)
		return err == nil && len(r.Each) == 3
	})
	checkDigests(t, cl, 1, 3)
}

// TestNoWriteWithoutFeedToLiveReplica (issue 10 item 5a): an initiator
// whose feed to a node holding a live replica never opens must not
// sequence a write of that partition. Before, its wait for feeds gave up
// after 3 s and it sent the txn to the replicas it had a feed to, and
// acknowledged it: the replica without the feed never got it, tracked no
// such initiator, and ran later txns past it, a silent divergence.
func TestNoWriteWithoutFeedToLiveReplica(t *testing.T) {
	cfg := layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	c := newClusterStarting(t, 3, 0, cfg)
	// A feed that never opens is a one-way cut, whose fence
	// (supervise.CutDue) takes its initiator out within 2 s: the test is
	// of what the initiator does while it stays in.
	c.noCutFence = true
	c.startCfg(1, func(cfg *Config) { cfg.knobs.noFeedTo = func(node string) bool { return node == NodeName(3) } })
	c.start(2)
	c.start(3)
	cl2 := dialClient(t, c.nodes[2].addrs.TCP)
	waitWritable(t, cl2, 1)
	upsert(t, cl2, 1, 1)
	cl1 := dialClient(t, c.nodes[1].addrs.TCP)
	key := wire.Bytes([]byte("from-n1"))
	r, err := cl1.call(0, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes([]byte("v")))
	if err == nil {
		checkDigests(t, cl2, 1, 3)
		t.Fatalf("n1 acknowledged a write (txn %v) with no feed to n3's live replica", r.ID)
	}
	if r == nil || r.Uncertain || !strings.Contains(err.Error(), NodeName(3)) {
		t.Fatalf("n1's refusal: %v (reply %+v), want a definite failure that names n3", err, r)
	}
	upsert(t, cl2, 1, 2)
	checkDigests(t, cl2, 1, 3)
}

// TestRejoinWaitsForLateFeed (issue 10 item 5b): a process of a node
// holding a replica of the partition starts while n3 rejoins, and its
// feed to n3 does not open while its feed to the source does. It joins
// the partition at the source, which may run its txns past E, which n3
// never got, so n3 must not go live: its attempts abort at the handoff
// (uncovered) until the feed opens, and then it goes live, equal to the
// others. Before, the attempt's coverage was the feeds open at its
// start; n3 went live without the newcomer's feed.
func TestRejoinWaitsForLateFeed(t *testing.T) {
	cfg := layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	// A feed that never opens is a one-way cut, whose fence
	// (supervise.CutDue) takes its initiator out within 2 s: the test is
	// of what the initiator does while it stays in.
	c := newClusterWith(t, 3, 3, cfg, func(c *cluster) { c.noCutFence = true })
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	rows := make([]wire.Value, 0, 2+2*400)
	for b := range 50 {
		rows = append(rows[:0], wire.String("kv"), wire.Int64(400))
		for i := range 400 {
			rows = append(rows, wire.Bytes(fmt.Appendf(nil, "key-%08d", b*400+i)), wire.Bytes(make([]byte, 1000)))
		}
		if _, err := cl.call(0, partition.ProcUpsertMany, false, rows...); err != nil {
			t.Fatal(err)
		}
	}
	c.stop(3)
	for _, id := range []int{1, 2} {
		fault(t, c.nodes[id].addrs, "/fault/hold?partition=0&rows=5000")
	}
	a3 := c.start(3)
	src := 0
	waitUntil(t, 20*time.Second, "a source to hold mid-snapshot", func() bool {
		for _, id := range []int{1, 2} {
			st := nodeStatus(t, c.nodes[id].addrs)
			if len(st.Replicas[0].Sources) == 1 && st.Replicas[0].Sources[0].Held {
				src = id
				return true
			}
		}
		return false
	})
	// The other holder comes back as a new process whose feed to n3
	// does not open.
	late := 3 - src
	c.stop(late)
	var blocked atomic.Bool
	blocked.Store(true)
	aLate := c.startCfg(late, func(cfg *Config) {
		cfg.knobs.noFeedTo = func(node string) bool { return node == NodeName(3) && blocked.Load() }
	})
	// It refuses a write with no feed to n3, and names n3 alone: its
	// feeds to the source and itself are open.
	clLate := dialClient(t, aLate.TCP)
	key := wire.Bytes([]byte("from-late"))
	if _, err := clLate.call(0, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes([]byte("v"))); err == nil ||
		!strings.Contains(err.Error(), "no feed open to "+NodeName(3)+",") {
		t.Fatalf("n%d's write with no feed to n3: %v", late, err)
	}
	fault(t, c.nodes[src].addrs, "/fault/release?partition=0")
	waitUntil(t, 30*time.Second, "an attempt of n3 aborted as uncovered", func() bool {
		r := nodeStatus(t, a3).Replicas[0]
		if r.State == recovery.ReplicaLive {
			t.Fatalf("n3's replica went live with no feed from n%d: %+v", late, r.Rejoin)
		}
		return r.Rejoin != nil && strings.Contains(r.Rejoin.Err, "uncovered")
	})
	blocked.Store(false)
	waitUntil(t, 30*time.Second, "every replica live once the late feed opened", func() bool { return allLive(t, c) })
	for i := range 20 {
		upsert(t, clLate, 1, i)
		upsert(t, cl, 1, 100+i)
	}
	checkDigests(t, cl, 1, 3)
}

// TestInitiatorBehindJoins: a node whose clock runs behind the others'
// comes back and writes. Its txn IDs come from its clock, so without a
// floor its first ones lie below what the replicas on the other nodes
// already executed: they refuse them as too late and fail, every live
// copy of the partition at once. The same happens within one millisecond
// on one clock, when a newcomer's first ID takes a lower counter than
// the txns executed just before its feed opened. A feed's receiver now
// answers with the highest ID its replicas executed, and the initiator
// issues nothing at or below it.
func TestInitiatorBehindJoins(t *testing.T) {
	cfg := layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	c := newCluster(t, 3, cfg)
	cl1 := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl1, 1)
	for i := range 50 {
		upsert(t, cl1, 1, i)
	}
	c.stop(3)
	for i := 50; i < 100; i++ {
		upsert(t, cl1, 1, i)
	}
	const behind = 2000 // ms
	c.startCfg(3, func(cfg *Config) {
		cfg.knobs.clock = func() int64 { return time.Now().UnixMilli() - behind }
	})
	cl3 := dialClient(t, c.nodes[3].addrs.TCP)
	waitWritable(t, cl3, 1)
	for i := 100; i < 150; i++ {
		upsert(t, cl3, 1, i)
	}
	for _, id := range []int{1, 2} {
		for _, rs := range nodeStatus(t, c.nodes[id].addrs).Replicas {
			if rs.State != recovery.ReplicaLive {
				t.Fatalf("%s's replica of partition %d is %s after n3's writes", NodeName(id), rs.Partition, rs.State)
			}
		}
	}
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	for i := 150; i < 200; i++ {
		upsert(t, cl3, 1, i)
	}
	// n1 waits for n3's replica once its own view, read every 100 ms,
	// has it live.
	waitUntil(t, 10*time.Second, "n1's digest call waits for every replica", func() bool {
		r, err := cl1.call(0, partition.ProcDigest, true)
		return err == nil && len(r.Each) == 3
	})
	checkDigests(t, cl1, 1, 3)
}

// TestRestartBelowItsLastBeat: n3's first process, quiet, leads its
// heartbeats 5 s ahead of its clock, above the replicas' safe point,
// which the other initiators hold at theirs. Its restart, with a clock
// behind, got a floor at that safe point, below the last heartbeat the
// replicas took from initiator 3, and its first txns came below it:
// each replica dropped them as already taken (a resumed feed's
// duplicates), then held every heartbeat of the feed behind the txn it
// had read and never ran. The call was never answered and partition 0
// ran nothing more (TestInitiatorBehindJoins hung about one run in five
// under -race). The floor covers what the replica took from the
// initiator's earlier processes.
func TestRestartBelowItsLastBeat(t *testing.T) {
	cfg := layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	c := newClusterStarting(t, 3, 2, cfg)
	c.startCfg(3, func(cfg *Config) { cfg.BeatLead = 5 * time.Second })
	cl1 := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl1, 1)
	for i := range 50 {
		upsert(t, cl1, 1, i)
	}
	c.stop(3)
	c.startCfg(3, func(cfg *Config) {
		cfg.knobs.clock = func() int64 { return time.Now().UnixMilli() - 2000 }
	})
	cl3 := dialClient(t, c.nodes[3].addrs.TCP)
	waitWritable(t, cl3, 1)
	for i := 50; i < 100; i++ {
		upsert(t, cl3, 1, i)
	}
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	for i := 100; i < 150; i++ {
		upsert(t, cl3, 1, i)
		upsert(t, cl1, 1, i+1000)
	}
	checkDigests(t, cl1, 1, 3)
}

// TestFeedLostFromSupersededProcess: n3's process dies without saying
// goodbye to etcd, and a new process of n3 registers over its record at
// once but cannot open its feed to n2 yet. The old process's feed into n2
// ended and its tail was repaired; the new process is another initiator
// incarnation, so nothing of the old one can be missing. Before, n2 took
// "n3 is alive" for "the process of the lost feed lives" and failed every
// replica after 3 node TTLs (rejoin chaos seed 1123, 10 minutes: with n1
// killed as well, partitions 0, 4 and 5 were left with no live replica).
func TestFeedLostFromSupersededProcess(t *testing.T) {
	const ttl = 2 * time.Second
	cfg := layout.Config{Partitions: 2, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	// A feed that never opens is a one-way cut, whose fence
	// (supervise.CutDue) takes its initiator out within 2 s: the test is
	// of what the others do with its old process's feed meanwhile.
	c := newClusterWith(t, 3, 2, cfg, func(c *cluster) { c.nodeTTL, c.noCutFence = ttl, true })
	c.startCfg(3, func(cfg *Config) { cfg.knobs.crash = true })
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 2)
	for i := range 200 {
		upsert(t, cl, 2, i)
	}
	// n3's old process leaves its record behind, and the new one takes it
	// over at once.
	c.stop(3)
	var blocked atomic.Bool
	blocked.Store(true)
	c.startCfg(3, func(cfg *Config) {
		cfg.knobs.noFeedTo = func(node string) bool { return node == NodeName(2) && blocked.Load() }
	})
	// Past 3 node TTLs: n2's replicas must stay live, never rejoined.
	deadline := time.Now().Add(4*ttl + 2*time.Second)
	for time.Now().Before(deadline) {
		for _, rs := range nodeStatus(t, c.nodes[2].addrs).Replicas {
			if rs.State != recovery.ReplicaLive || rs.Rejoin != nil {
				t.Fatalf("n2's replica of partition %d: state %s, rejoin %+v: failed for the lost feed of a process superseded by a newer one", rs.Partition, rs.State, rs.Rejoin)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	blocked.Store(false)
	i := 200
	waitUntil(t, 60*time.Second, "every replica live", func() bool {
		upsert(t, cl, 2, i)
		i++
		return allLive(t, c)
	})
	waitUntil(t, 5*time.Second, "every replica answering n1's calls", func() bool {
		for p := range uint32(2) {
			r, err := cl.call(p, partition.ProcDigest, true)
			if err != nil || len(r.Each) != 3 {
				return false
			}
		}
		return true
	})
	checkDigests(t, cl, 2, 3)
}

// TestWritesNeedNoPeriodicBeat: the replicas of a write through n1 run it
// only once n2's and n3's initiators have passed it. With their periodic
// heartbeats an hour apart, only the heartbeats n1's BeatAsks call for
// let them, so every write is answered well within the test's bound
// (docs/DESIGN.md "Heartbeats on demand"). Without the asks, the first
// write waited for the first periodic heartbeat, an hour away.
func TestWritesNeedNoPeriodicBeat(t *testing.T) {
	c := newClusterStarting(t, 3, 0, kv())
	var mu sync.Mutex
	open := map[string]bool{}
	for id := 1; id <= 3; id++ {
		c.startCfg(id, func(cfg *Config) {
			cfg.BeatEvery = time.Hour
			cfg.knobs.feedOpen = func(node string) {
				mu.Lock()
				open[fmt.Sprintf("%d>%s", id, node)] = true
				mu.Unlock()
			}
		})
	}
	// Every initiator's feed to every node open first: an initiator asks
	// only the nodes it has a feed to, and a feed that opens after the
	// last ask has its first heartbeat at the first tick, an hour away.
	waitUntil(t, 20*time.Second, "every feed open", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(open) == 9
	})
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	done := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, err := cl.call(0, partition.ProcDigest, false)
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), "not bootstrapped") && !strings.Contains(err.Error(), "no feed open") || time.Now().After(deadline) {
				done <- fmt.Errorf("cluster not writable: %w", err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		for i := range 50 {
			key := wire.Bytes(fmt.Appendf(nil, "key-%06d", i))
			p, err := partition.RouteValues([]wire.Value{key}, 2)
			if err == nil {
				_, err = cl.call(p, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes([]byte("v")))
			}
			if err != nil {
				done <- fmt.Errorf("upsert %d: %w", i, err)
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("writes through n1 not answered within 30 s: its replicas wait for the other initiators' periodic heartbeats")
	}
}

// TestWriteQueueCoalesces: of a burst on a feed, Beats queued one after
// another go out as the last of them, a Beat before a Txn goes out before
// it, and the BeatAsks go out as one, the highest, last.
func TestWriteQueueCoalesces(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	id := func(n int64) txnid.ID { return txnid.Make(1000+n, 0, 1) }
	q := make(chan wire.Message, 16)
	for _, m := range []wire.Message{&wire.Beat{ID: id(1)}, &wire.BeatAsk{ID: id(9)}, &wire.Beat{ID: id(2)}, &wire.Txn{Partition: 1, ID: id(3), Proc: "p"},
		&wire.Beat{ID: id(4)}, &wire.BeatAsk{ID: id(11)}, &wire.Beat{ID: id(5)}, &wire.BeatAsk{ID: id(10)}} {
		q <- m
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		writeQueue(context.Background(), stream.NewConn(a, stream.Config{Codec: wire.CodecNone}), q, stop)
	}()
	r := stream.NewConn(b, stream.Config{})
	var got []string
	for range 4 {
		m, err := r.Recv()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *wire.Beat:
			got = append(got, fmt.Sprintf("beat %d", m.ID.Millis()-1000))
		case *wire.BeatAsk:
			got = append(got, fmt.Sprintf("ask %d", m.ID.Millis()-1000))
		case *wire.Txn:
			got = append(got, fmt.Sprintf("txn %d", m.ID.Millis()-1000))
		}
	}
	close(stop)
	<-done
	if want := "beat 2, txn 3, beat 5, ask 11"; strings.Join(got, ", ") != want {
		t.Fatalf("wrote %s, want %s", strings.Join(got, ", "), want)
	}
}

// TestFeedInsHold: the results a lost registration holds. Held from the
// time holdFrom names, not before; a partition freed by its settlement
// sends what was held of it and passes from then on while the others
// stay held; a second loss before the settlement ended holds the freed
// ones again (unsettle); release sends what stands and drops the rest.
func TestFeedInsHold(t *testing.T) {
	fi := &feedIn{in: 1, q: make(chan wire.Message, 16)}
	f := &feedIns{by: map[txnid.Initiator]*feedIn{1: fi}}
	sent := func() []uint32 {
		var ps []uint32
		for {
			select {
			case m := <-fi.q:
				ps = append(ps, m.(*wire.Done).Partition)
			default:
				return ps
			}
		}
	}
	done := func(p uint32) { f.done(1, &wire.Done{Partition: p}) }
	want := func(what string, ps ...uint32) {
		t.Helper()
		if got := sent(); fmt.Sprint(got) != fmt.Sprint(ps) {
			t.Fatalf("%s: sent %v, want %v", what, got, ps)
		}
	}

	f.holdFrom(time.Now().Add(time.Hour))
	done(1)
	want("before the hold's start", 1)
	if !f.settling() {
		t.Fatal("not settling with a hold to come")
	}

	f.holdFrom(time.Now())
	done(1)
	done(2)
	done(3)
	want("held")
	f.free([]uint32{1, 3})
	want("freed", 1, 3)
	done(1)
	done(2)
	want("1 passes, 2 held", 1)
	f.unsettle()
	done(1)
	want("held again after a second loss")
	f.release(func(p uint32) bool { return p != 2 })
	want("released", 1)
	done(2)
	want("after the release", 2)
	if f.settling() {
		t.Fatal("settling after the release")
	}
}

// TestFailedReplicaSendsNothingHeld: a replica that fails while a lapse
// holds its results sends none of them, whatever stands of its partition
// when the settlement frees or releases it. Those decide by partition,
// and by then a replica rebuilt since may stand there: the failed one's
// results, held under the same partition, went out with its own (a
// replica fails when it may have run what no live replica elsewhere
// will, so an answer of it may acknowledge a write kept nowhere).
func TestFailedReplicaSendsNothingHeld(t *testing.T) {
	n := testNode(t, t.TempDir())
	r, slots, done := beatReplica(t, n, 1, true)
	n.feeds.holdFrom(time.Now())
	r.run(testTxn(txnid.Make(100, 0, 1)))
	slots[2].raise(txnid.Make(110, 0, 2))
	r.maybePullBeats()
	r.step()
	n.feeds.mu.Lock()
	held := len(n.feeds.held)
	n.feeds.mu.Unlock()
	if held != 1 {
		t.Fatalf("%d results held, want the txn's", held)
	}
	r.fail("test: failed while its results are held")
	// As freeSettled, once a replica rebuilt since stands, and the
	// settlement's end.
	n.feeds.free([]uint32{1})
	n.feeds.release(func(uint32) bool { return true })
	if got := ranIDs(done); len(got) > 0 {
		t.Fatalf("sent the results of %v, held by a replica that failed since", got)
	}
}
