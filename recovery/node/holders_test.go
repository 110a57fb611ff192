package node

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream/faultnet"
	"github.com/rejoin-db/rejoin/wire"
)

// TestSilentNodeStallsOnlyItsPartitions: three nodes, two replicas of each
// partition. n2 goes silent (not a byte to or from its peers or etcd) for
// three node TTLs. The partitions it holds no replica of never wait for
// it: only their holders sequence their txns, and a replica tracks only
// the initiators that joined its partition (docs/DESIGN.md "Sequencers
// per partition"). Before, every replica tracked every node's initiator,
// and writes to those partitions stopped until n2 was fenced, as long as
// writes to n2's own (about 2 s). A call through a node that holds no
// replica of its partition is forwarded to one that does.
func TestSilentNodeStallsOnlyItsPartitions(t *testing.T) {
	const ttl = 2 * time.Second
	const parts = 6
	c, etcdPx := newClusterN2ViaProxyWith(t, layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}}, ttl, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
	})
	onN2 := partitionsOn(t, c, "n2")
	cl := dialClient(t, c.direct(1))
	waitWritable(t, cl, parts)
	// A partition n1 holds no replica of is written through n1 all the
	// same: forwarded to a holder.
	for p := range uint32(parts) {
		if _, err := cl.call(p, partition.ProcDigest, false); err != nil {
			t.Fatalf("partition %d through n1: %v", p, err)
		}
	}
	ws, stopWriters := startAwayWriters(t, c, parts, onN2, []int{1, 3})
	defer stopWriters()

	thaw := freezeAll(append(c.pathsOf(2), etcdPx))
	defer thaw()
	frozen := time.Now()
	time.Sleep(3 * ttl)
	thaw()
	checkAwayGaps(t, ws, frozen, time.Now(), "n2", "of its silence")
	checkAwayEnd(t, c, cl, parts, ws, stopWriters, 2)
}

// TestRestartedCutOffNodeStallsOnlyItsPartitions: n2 stops, and its next
// process starts cut off from its peers (it reaches etcd and registers):
// alive in every view, it opens no feed anywhere until its peers fence
// it. Writes through n1 and n3 to the partitions n2 holds no replica of
// must not wait for it.
func TestRestartedCutOffNodeStallsOnlyItsPartitions(t *testing.T) {
	const ttl = 2 * time.Second
	const parts = 6
	c, _ := newClusterN2ViaProxyWith(t, layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}}, ttl, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
		// A new process registers only once it reaches its peers
		// (reachPeers); this test is of one registered while cut off,
		// as one cut off right after it reached them is.
		c.noReachGate = true
	})
	onN2 := partitionsOn(t, c, "n2")
	cl := dialClient(t, c.direct(1))
	waitWritable(t, cl, parts)
	ws, stopWriters := startAwayWriters(t, c, parts, onN2, []int{1, 3})
	defer stopWriters()

	c.stop(2)
	waitRegistered(t, c, "n2", false, 10*time.Second, "n2 gone")
	thaw := freezeAll(c.pathsOf(2))
	defer thaw()
	from := time.Now()
	c.start(2)
	time.Sleep(3 * ttl)
	checkAwayGaps(t, ws, from, time.Now(), "n2", "after its new process started cut off")
	thaw()
	checkAwayEnd(t, c, cl, parts, ws, stopWriters, 2)
}

// TestFencedNodeBackBesideCutOffNewProcess: the case of chaos seeds
// 444388825 and 5511 whole. n2 goes silent (peers and etcd) until its
// peers take it for dead; meanwhile n1 stops, and its next process
// starts cut off from its peers. n2 comes back, its replicas fail and
// rejoin. The partitions n1 holds no replica of must go on being written
// through n3 and n4 without waiting for n1's new process to be fenced:
// the repair of n2's tail in n1's partitions waits for n1, and the
// others waited with it (1.74 to 1.86 s without a write).
func TestFencedNodeBackBesideCutOffNewProcess(t *testing.T) {
	const ttl = 2 * time.Second
	const parts = 4
	var logs logCatch
	c, etcdPx := newClusterNViaProxy(t, 4, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, ttl, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
		// A new process registers only once it reaches its peers
		// (reachPeers); this test is of one registered while cut off,
		// as one cut off right after it reached them is.
		c.noReachGate = true
		c.onLog = func(id int, r slog.Record) {
			if r.Message == "process fenced by its peers' reports: taken for dead here" {
				logs.add("taken", id, r)
			}
		}
	})
	onN1 := partitionsOn(t, c, "n1")
	cl := dialClient(t, c.direct(3))
	waitWritable(t, cl, parts)
	ws, stopWriters := startAwayWriters(t, c, parts, onN1, []int{3, 4})
	defer stopWriters()

	thawN2 := freezeAll(append(c.pathsOf(2), etcdPx))
	defer thawN2()
	// Fenced by its peers, or its lease ended first: either way gone.
	waitRegistered(t, c, "n2", false, 15*time.Second, "n2 taken for dead")
	c.stop(1)
	waitRegistered(t, c, "n1", false, 10*time.Second, "n1 gone")
	thawN1 := freezeAll(c.pathsOf(1))
	defer thawN1()
	c.start(1)
	thawN2()
	from := time.Now()
	waitUntil(t, 15*time.Second, "n1's new process taken for dead", func() bool {
		return slices.ContainsFunc(logs.seen("taken"), func(s string) bool { return strings.Contains(s, `node="n1"`) })
	})
	time.Sleep(time.Second)
	checkAwayGaps(t, ws, from, time.Now(), "n1", "after n2 came back beside n1's cut-off new process")
	thawN1()
	checkAwayEnd(t, c, cl, parts, ws, stopWriters, 3)
}

// TestResetNodeStallsOnlyItsPartitions: every connection between n1 and
// its peers is reset, and every new one too, for three TTLs (a partition
// that answers with resets, not silence). n1 holds no replica of some
// partitions: writes to them through the other four nodes, holders and
// nodes that forward, must not wait for it. (Chaos seed 5511 saw 0.8 s
// without a successful op in such partitions over a reset of a node's
// peer links among other faults; this case alone stays near 14 ms.)
func TestResetNodeStallsOnlyItsPartitions(t *testing.T) {
	const ttl = 2 * time.Second
	const parts = 5
	c, _ := newClusterNViaProxy(t, 5, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, ttl, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
	})
	onN1 := partitionsOn(t, c, "n1")
	cl := dialClient(t, c.direct(3))
	waitWritable(t, cl, parts)
	ws, stopWriters := startAwayWriters(t, c, parts, onN1, []int{2, 3, 4, 5})
	defer stopWriters()

	from := time.Now()
	for _, px := range c.pathsOf(1) {
		px.Reset(3 * ttl)
	}
	time.Sleep(3 * ttl)
	checkAwayGaps(t, ws, from, time.Now(), "n1", "while its links were reset")
	checkAwayEnd(t, c, cl, parts, ws, stopWriters, 3)
}

// replicaRecords reads the replica records from etcd.
func replicaRecords(t *testing.T, c *cluster) []supervise.Replica {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rs, err := supervise.Replicas(ctx, c.admin)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// holdersByPartition is the placement in etcd: the nodes, of n1..n<nodes>,
// holding a replica of each partition, in node order.
func holdersByPartition(t *testing.T, c *cluster, nodes int) map[uint32][]int {
	t.Helper()
	rs := replicaRecords(t, c)
	holders := map[uint32][]int{}
	for id := 1; id <= nodes; id++ {
		for _, r := range rs {
			if r.Node == NodeName(id) {
				holders[r.Partition] = append(holders[r.Partition], id)
			}
		}
	}
	return holders
}

// partitionsOn returns the partitions with a replica on node, as etcd's
// records place them.
func partitionsOn(t *testing.T, c *cluster, node string) map[uint32]bool {
	t.Helper()
	on := map[uint32]bool{}
	for _, r := range replicaRecords(t, c) {
		if r.Node == node {
			on[r.Partition] = true
		}
	}
	if len(on) == 0 || len(on) == int(c.cfg.Partitions) {
		t.Fatalf("placement gives %s partitions %v of %d: the test needs some on it and some not", node, on, c.cfg.Partitions)
	}
	return on
}

// startAwayWriters starts a writer through each of nodes to the
// partitions not in on, and waits until each has written.
func startAwayWriters(t *testing.T, c *cluster, parts uint32, on map[uint32]bool, nodes []int) ([]*feedWriter, func()) {
	t.Helper()
	ws, stop := startFeedWritersOnly(t, c, parts, nodes, 2*time.Millisecond, func(p uint32) bool { return !on[p] })
	waitWriting(t, ws, "writes through every writer's node")
	return ws, stop
}

// checkAwayEnd waits for every replica live again, stops the writers ws
// (stop) and checks that their acknowledged writes read back and that
// the replicas of each partition agree.
func checkAwayEnd(t *testing.T, c *cluster, cl *rawClient, parts uint32, ws []*feedWriter, stop func(), replicas int) {
	t.Helper()
	waitSettled(t, c, cl, parts, replicas)
	stop()
	checkAcked(t, cl, parts, ws)
	checkDigests(t, cl, parts, replicas)
}

// waitSettled waits until every replica is live and answers a digest
// through cl. Live in etcd is not settled: after a fenced node came back,
// a peer still repairing its tail (a repair ask takes up to
// repairTimeout) answers its feeds Fenced, and its replicas fail and
// rebuild again while etcd said live a moment ago (under load, for 5 s
// past the heal); a replica that ran a write the others never got fails
// once its feeds open again, after etcd said live.
func waitSettled(t *testing.T, c *cluster, cl *rawClient, parts uint32, replicas int) {
	t.Helper()
	waitUntil(t, 30*time.Second, "every replica live again and answering", func() bool {
		if !allLive(t, c) {
			return false
		}
		for p := range parts {
			if r, err := cl.call(p, partition.ProcDigest, true); err != nil || len(r.Each) != replicas {
				return false
			}
		}
		return true
	})
}

// awayGapMax bounds, in these tests, the longest gap of writes to the
// partitions the faulted node holds no replica of. The goal is 0.5 s
// (issue 23); the bound leaves a loaded machine room and still fails a
// stall until the fence.
const awayGapMax = time.Second

// checkAwayGaps fails a writer of ws whose longest gap in [from, to]
// passes awayGapMax; node is the faulted node, during what names the
// span.
func checkAwayGaps(t *testing.T, ws []*feedWriter, from, to time.Time, node, during string) {
	t.Helper()
	for _, w := range ws {
		w.mu.Lock()
		gap := longestGap(w.ackedAt, from, to)
		w.mu.Unlock()
		t.Logf("writes through n%d to the partitions %s holds no replica of, in the %v %s: longest gap %v",
			w.node, node, to.Sub(from).Round(time.Millisecond), during, gap.Round(time.Millisecond))
		if gap > awayGapMax {
			t.Errorf("writes through n%d to partitions without a replica on %s stopped for %v %s, want at most %v",
				w.node, node, gap.Round(time.Millisecond), during, awayGapMax)
		}
	}
}

// TestStalledReplicaSaysWhatItWaitsFor: a replica that holds a txn it
// cannot run for a second logs which initiator it waits for, and what it
// took from it and what its feed brought. Here n2's feed into n1 is cut
// (n2 itself stays up, and the fence for a cut between two nodes is off
// here, so nobody fences it): n1's replica of a partition both hold
// waits for initiator 2's heartbeat past a write through n1.
// A stall of the chaos run (a partition without a faulted replica, 1.8 s
// without a successful op) left no line saying why.
func TestStalledReplicaSaysWhatItWaitsFor(t *testing.T) {
	const parts = 3
	var logs logCatch
	c := newClusterWith(t, 3, 3, layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}}, func(c *cluster) {
		c.proxied, c.pairProxied, c.noCutFence = true, true, true
		c.onLog = func(id int, r slog.Record) {
			if strings.HasPrefix(r.Message, "replica holds txns it cannot run") {
				logs.add("wait", id, r)
			}
		}
	})
	p, cl, thaw := stallOnN1(t, c, parts)
	defer thaw()
	written := make(chan error, 1)
	go func() {
		_, err := cl.call(p, partition.ProcUpsert, false, wire.String("kv"), wire.Bytes([]byte("stalled")), wire.Bytes([]byte("v")))
		written <- err
	}()
	want := fmt.Sprintf(`partition="%d"`, p)
	waitUntil(t, 10*time.Second, "n1 to log what its stalled replica waits for", func() bool {
		return slices.ContainsFunc(logs.seen("wait"), func(s string) bool {
			return strings.HasPrefix(s, "n1: replica holds txns it cannot run: an initiator has not passed the oldest:") &&
				strings.Contains(s, want) && strings.Contains(s, `initiator="2"`) && strings.Contains(s, `node="n2"`)
		})
	})
	t.Logf("%s", logs.seen("wait")[0])
	thaw()
	select {
	case err := <-written:
		if err != nil {
			t.Fatalf("the write held by the cut: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the write held by the cut did not end after the heal")
	}
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	checkDigests(t, cl, parts, 2)
}

// stallOnN1 finds a partition p with replicas on n1 and n2 of c (pair
// proxied, 2 replicas), has n2 sequence a call of p, then cuts n2's feed
// into n1 (n2 itself stays up, so nobody fences it) and waits past what
// n2's last heartbeat promised: a write of p through n1, whose replica
// there waits for initiator 2 to pass it, stalls until thaw. It returns a
// client of n1.
func stallOnN1(t *testing.T, c *cluster, parts uint32) (p uint32, cl *rawClient, thaw func()) {
	t.Helper()
	on1, on2 := partitionsOn(t, c, "n1"), partitionsOn(t, c, "n2")
	p = parts
	for q := range parts {
		if on1[q] && on2[q] {
			p = q
		}
	}
	if p == parts {
		t.Fatalf("no partition on both n1 (%v) and n2 (%v)", on1, on2)
	}
	cl = dialClient(t, c.direct(1))
	waitWritable(t, cl, parts)
	upsert(t, cl, parts, 0)
	// A call of p sequenced by n2 waits for n2's join of p on its feed
	// into n1 to be answered: only then does n1's replica track
	// initiator 2. A join still in flight when the feed froze left it
	// untracked, and the write through n1 ran at once (3 runs in 20).
	if _, err := dialClient(t, c.direct(2)).call(p, partition.ProcDigest, false); err != nil {
		t.Fatalf("a call of partition %d through n2: %v", p, err)
	}
	thaw = freezeAll([]*faultnet.Proxy{c.pairs[[2]int{2, 1}]})
	// Past what n2's last heartbeat promised (a quiet initiator's leads
	// the clock) and past the feed's stall window, after which n1 waits
	// for the feed to resume.
	time.Sleep(1500 * time.Millisecond)
	return p, cl, thaw
}

// TestCallWaitAnswersAStalledCall: a call whose replica does not answer
// within Config.CallWait is answered as of unknown outcome, naming the
// replica and its feed, and the node logs it; after the heal both
// replicas agree, the write run on both or on neither. Before the bound
// a call waited for as long as its replica did (a writer stuck in a call
// failed CI's TestFencedNodeBackMidRepair with nothing said of where).
func TestCallWaitAnswersAStalledCall(t *testing.T) {
	const parts = 3
	const wait = time.Second
	var logs logCatch
	c := newClusterWith(t, 3, 0, layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}}, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
		c.onLog = func(id int, r slog.Record) {
			if strings.HasPrefix(r.Message, "a call waited out --call-wait") {
				logs.add("expired", id, r)
			}
		}
	})
	for id := 1; id <= 3; id++ {
		c.startCfg(id, func(cfg *Config) { cfg.CallWait = wait })
	}
	p, cl, thaw := stallOnN1(t, c, parts)
	defer thaw()
	start := time.Now()
	written := make(chan error, 1)
	go func() {
		_, err := cl.call(p, partition.ProcUpsert, false, wire.String("kv"), wire.Bytes([]byte("stalled")), wire.Bytes([]byte("v")))
		written <- err
	}()
	var err error
	select {
	case err = <-written:
	case <-time.After(wait + 20*time.Second):
		thaw()
		<-written
		t.Fatalf("the stalled write not answered %v after it was sent, with a call wait of %v", time.Since(start).Round(time.Millisecond), wait)
	}
	took := time.Since(start)
	t.Logf("the stalled write answered after %v: %v", took.Round(time.Millisecond), err)
	if err == nil {
		t.Fatal("the stalled write succeeded while n1's replica could not run it")
	}
	if !strings.Contains(err.Error(), "from the replica on n1 (feed open") || !strings.Contains(err.Error(), "outcome is unknown") {
		t.Fatalf("the stalled write's error %q, want one naming n1's replica and an unknown outcome", err)
	}
	// Counted in ticks, of which the first may be partial.
	if took < wait-10*time.Millisecond {
		t.Fatalf("answered after %v, before the call wait %v", took, wait)
	}
	want := fmt.Sprintf(`partition="%d"`, p)
	waitUntil(t, 5*time.Second, "n1 to log the expired call", func() bool {
		return slices.ContainsFunc(logs.seen("expired"), func(s string) bool {
			return strings.HasPrefix(s, "n1: ") && strings.Contains(s, want) && strings.Contains(s, "n1 (feed open")
		})
	})
	thaw()
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	waitSettled(t, c, cl, parts, 2)
	checkDigests(t, cl, parts, 2)
}

// TestWaitingCallHoldsNoOtherCall: a client's call of a partition whose
// node has no feed open yet waits for it (up to feedWait), and a call of
// another partition pipelined behind it on the same connection must not
// wait with it. n2 restarts with its links to n1 cut (it reaches n3 and
// etcd, so nobody fences it): n1's first feed to n2's new process never
// opens, and n1's calls of the partitions n2 holds wait. Before, the node
// read a connection's next call only once the last one was sequenced,
// and every partition's calls through that connection waited for n2
// (rejoin chaos --seed 20261128, 10m: partitions no fault touched, 1.9 s
// without a successful op, each of their probe's calls through every
// node unanswered in 250 ms, right after a node restarted cut off from
// its peers).
func TestWaitingCallHoldsNoOtherCall(t *testing.T) {
	const parts = 6
	c := newClusterWith(t, 3, 3, layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}}, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
		// A new process registers only once it reaches its peers
		// (reachPeers); this test is of one registered while cut off,
		// as one cut off right after it reached them is.
		c.noReachGate = true
	})
	on1, on2 := partitionsOn(t, c, "n1"), partitionsOn(t, c, "n2")
	held, free := uint32(parts), uint32(parts)
	for q := range uint32(parts) {
		switch {
		case on1[q] && on2[q]:
			held = q
		case on1[q] && !on2[q]:
			free = q
		}
	}
	if held == parts || free == parts {
		t.Fatalf("placement n1 %v, n2 %v: no partition on both, or none on n1 alone", on1, on2)
	}
	cl := dialClient(t, c.direct(1))
	waitWritable(t, cl, parts)

	c.stop(2)
	waitRegistered(t, c, "n2", false, 10*time.Second, "n2 gone")
	thaw := freezeAll([]*faultnet.Proxy{c.pairs[[2]int{1, 2}], c.pairs[[2]int{2, 1}]})
	defer thaw()
	c.start(2)
	waitRegistered(t, c, "n2", true, 10*time.Second, "n2 registered again")
	time.Sleep(300 * time.Millisecond) // n1's view has n2's new process: its feed there dials

	call := func(req uint64, p uint32) {
		params, err := wire.NewTupleEncoder().AppendTuple(nil, []wire.Value{wire.String("kv"), wire.Bytes(fmt.Appendf(nil, "k%d", req)), wire.Bytes([]byte("v"))})
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.conn.Send(context.Background(), &wire.Call{Req: req, Partition: p, Proc: partition.ProcUpsert, Params: params}); err != nil {
			t.Fatal(err)
		}
	}
	sent := time.Now()
	call(101, held)
	call(102, free)
	var freeIn time.Duration
	for range 2 {
		m, err := cl.conn.Recv()
		if err != nil {
			t.Fatal(err)
		}
		r := m.(*wire.Reply)
		t.Logf("call %d answered after %v: err %q", r.Req, time.Since(sent).Round(time.Millisecond), r.Err)
		if r.Req == 102 {
			freeIn = time.Since(sent)
			if r.Err != "" {
				t.Errorf("the call of partition %d, which n2 holds no replica of: %s", free, r.Err)
			}
		}
	}
	// The held call waits for n2 up to feedWait; the free one, behind
	// it, must not.
	if freeIn > feedWait/2 {
		t.Errorf("the call of partition %d waited %v behind a call of partition %d that waited for n2's feed", free, freeIn.Round(time.Millisecond), held)
	}
	thaw()
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	cl.req = 1000
	checkDigests(t, cl, parts, 2)
}

// TestLiveFirst: a forwarded call goes to the holders whose replica is
// live first, each group in the sequencer order.
func TestLiveFirst(t *testing.T) {
	rps := []replicaPlace{{node: "n2"}, {node: "n4", live: true}, {node: "n5", live: true}}
	for _, tt := range []struct{ hs, want []string }{
		{[]string{"n2", "n4", "n5"}, []string{"n4", "n5", "n2"}},
		{[]string{"n5", "n2", "n4"}, []string{"n5", "n4", "n2"}},
		{[]string{"n4", "n5", "n2"}, []string{"n4", "n5", "n2"}},
	} {
		if got := liveFirst(tt.hs, rps); !slices.Equal(got, tt.want) {
			t.Errorf("liveFirst(%v) = %v, want %v", tt.hs, got, tt.want)
		}
	}
}

// TestRestartedNodeJoinsPastOthersRepair: a node restarts while a peer
// holding replicas with it is cut off. The others repair its old
// process's tail replica by replica, and the replicas of a partition
// the cut-off peer holds wait for it; a partition it holds no replica of
// takes the new process's writes at once. Before, a node answered a new
// process's feed only once every replica had settled the old tail, so
// the restarted node could sequence nothing until the cut-off peer was
// fenced (rejoin chaos --seed 406596625, 3m, +145.56 s: 0.84 s).
//
// The new process also joins a partition b the cut-off peer holds,
// whose replicas elsewhere never tracked the old process (it wrote
// nothing): they take the join at once, and the old tail's repair,
// once the peer answers or is fenced, must not remove the new process
// from them. It did: every replica of b then refused the new process's
// next txn ("unknown initiator") and failed (TestInitiatorBehindJoins
// failed so 2 runs of 20).
func TestRestartedNodeJoinsPastOthersRepair(t *testing.T) {
	const parts = 4
	var logs logCatch
	c := newClusterWith(t, 4, 4, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
		c.onLog = func(id int, r slog.Record) {
			if r.Message == "replica failed, needs a rejoin" {
				logs.add("failed", id, r)
			}
		}
	})
	on2, on3 := partitionsOn(t, c, "n2"), partitionsOn(t, c, "n3")
	a, b := uint32(parts), uint32(parts)
	for p := range uint32(parts) {
		if on2[p] && !on3[p] {
			a = p
		}
		if on3[p] {
			b = p
		}
	}
	if a == parts || b == parts {
		t.Fatalf("no partition on n2 (%v) without n3 (%v), or none on n3", on2, on3)
	}
	cl := dialClient(t, c.direct(1))
	waitWritable(t, cl, parts)
	for i := range 40 {
		upsert(t, cl, parts, i)
	}
	thawN3 := freezeAll(c.pathsOf(3))
	defer thawN3()
	c.stop(2)
	c.start(2)
	ready := time.Now()
	cl2 := dialClient(t, c.direct(2))
	var took time.Duration
	for i := 0; ; i++ {
		_, err := cl2.call(a, partition.ProcUpsert, false, wire.String("kv"), wire.Bytes(fmt.Appendf(nil, "after-%d", i)), wire.Bytes([]byte("v")))
		if err == nil {
			took = time.Since(ready)
			break
		}
		if time.Since(ready) > 30*time.Second {
			t.Fatalf("no write of partition %d through n2's new process in 30 s: %v", a, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fenced := fenceStands(c, "n3")
	t.Logf("first write of partition %d (no replica on n3) through n2's new process %v after it was ready; n3 fenced by then: %v", a, took.Round(time.Millisecond), fenced)
	if took > awayGapMax {
		t.Errorf("the first write of partition %d through n2's new process came %v after it was ready, want at most %v", a, took.Round(time.Millisecond), awayGapMax)
	}
	// n2 joins b: the call waits for n3's join and is refused, while
	// the holders that answer track the new process from here.
	sent := time.Now()
	_, err := cl2.call(b, partition.ProcUpsert, false, wire.String("kv"), wire.Bytes([]byte("b-cut")), wire.Bytes([]byte("v")))
	t.Logf("a write of partition %d (a replica on n3) through n2 answered after %v: %v; n3 fenced by then: %v", b, time.Since(sent).Round(time.Millisecond), err, fenceStands(c, "n3"))
	thawN3()
	waitSettled(t, c, cl, parts, 3)
	for p := range uint32(parts) {
		upsertVia(t, cl2, p, fmt.Sprintf("after-heal-%d", p))
	}
	for _, s := range logs.seen("failed") {
		if strings.Contains(s, "unknown initiator") {
			t.Errorf("a replica refused the new process's txn: %s", s)
		}
	}
	waitSettled(t, c, cl, parts, 3)
	checkDigests(t, cl, parts, 3)
}

// upsertVia writes key to partition p through cl, retried for 20 s while
// refused.
func upsertVia(t *testing.T, cl *rawClient, p uint32, key string) {
	t.Helper()
	if err := writeWithin(cl, p, key, 20*time.Second); err != nil {
		t.Fatalf("write of %s to partition %d: %v", key, p, err)
	}
}

// writeWithin writes key to partition p through cl, retried for d while
// it fails; it returns the last error if none succeeded.
func writeWithin(cl *rawClient, p uint32, key string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		_, err := cl.call(p, partition.ProcUpsert, false, wire.String("kv"), wire.Bytes([]byte(key)), wire.Bytes([]byte("v")))
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCutOffHoldersRefusedAtOnce: a node x is reset from the two holders
// of a partition p it holds no replica of, and no other link breaks (two
// reporters of four others fence no one), and x restarts. A call through
// x can go nowhere: of p, every holder is unreachable; of q, which x
// holds with one of them, x's new process has no feed to that replica.
// Once x has had no feed to them for unreachableAfter, such a call is
// refused at once, for the client to go through another node, instead
// of after feedWait: a chaos probe's calls through a node cut from its
// peers each waited out its 250 ms timeout (rejoin chaos --seed
// 20261128, 10m, +33.54 s: 0.52 s without a successful op in a partition
// neither node it tried held a replica of).
//
// Not covered: x's old process, whose feed to q's other holder broke
// and keeps its txns for a resume, sends q's calls into that log, and
// they wait for the resume, up to the call's bound: a partition whose
// holders cannot reach each other, neither fenced, serves nothing for as
// long as the cut lasts.
func TestCutOffHoldersRefusedAtOnce(t *testing.T) {
	const parts = 8
	c := newClusterWith(t, 5, 5, layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}}, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
		// A new process registers only once it reaches its peers
		// (reachPeers); this test is of one registered while cut off,
		// as one cut off right after it reached them is.
		c.noReachGate = true
	})
	holders := holdersByPartition(t, c, 5)
	x, p, q := 0, uint32(0), uint32(0)
	for id := 1; id <= 5 && x == 0; id++ {
		for a := range uint32(parts) {
			for b := range uint32(parts) {
				if !slices.Contains(holders[a], id) && slices.Contains(holders[b], id) &&
					slices.ContainsFunc(holders[a], func(h int) bool { return slices.Contains(holders[b], h) }) {
					x, p, q = id, a, b
				}
			}
		}
	}
	if x == 0 {
		t.Fatalf("no node x, partition p without a replica on x and q with one, sharing a holder: %v", holders)
	}
	cl := dialClient(t, c.direct(x))
	waitWritable(t, cl, parts)
	var cut []*faultnet.Proxy
	for _, h := range holders[p] {
		cut = append(cut, c.pairs[[2]int{x, h}], c.pairs[[2]int{h, x}])
	}
	for _, px := range cut {
		px.Reset(time.Minute)
	}
	c.stop(x)
	c.start(x)
	cl = dialClient(t, c.direct(x))
	time.Sleep(unreachableAfter + 500*time.Millisecond)
	for _, tc := range []struct {
		p    uint32
		want string
	}{
		{p, "has had no feed open to"},
		{q, "no feed open there for"},
	} {
		sent := time.Now()
		_, err := cl.call(tc.p, partition.ProcUpsert, false, wire.String("kv"), wire.Bytes([]byte("cut")), wire.Bytes([]byte("v")))
		t.Logf("partition %d (holders %v) through n%d, cut from %v: answered after %v: %v", tc.p, holders[tc.p], x, holders[p], time.Since(sent).Round(time.Millisecond), err)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("partition %d through n%d cut from %v: got %v, want a refusal saying %q", tc.p, x, holders[p], err, tc.want)
		}
	}
	for _, px := range cut {
		px.Reset(0)
	}
	for a := range uint32(parts) {
		upsertVia(t, cl, a, fmt.Sprintf("healed-%d", a))
	}
	waitSettled(t, c, cl, parts, 2)
	checkDigests(t, cl, parts, 2)
}

// TestDialEndsAtTheFence: x restarts cut from every peer (packets
// dropped, etcd reached), and its peers' dials to its new process hang.
// While a feed is being opened, every call of a partition x holds waits
// for it (a txn sent meanwhile would be missed there unnamed); once x is
// fenced, the dials must end at once, not at their timeout (2 s, here
// raised to 6 s so that the fence comes early in it) or at a floor's
// wait of a minute. Each other node writes to a partition it holds with
// x, so that the slowest dial bounds the test. Chaos seed 5150 (10m,
// +6.63 s) went 4.1 s without a successful op in four partitions, 1.6 s
// of it after the fence.
func TestDialEndsAtTheFence(t *testing.T) {
	const parts = 8
	const x = 3
	const dialWait = 6 * time.Second
	c := newClusterWith(t, 5, 0, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
		// A new process registers only once it reaches its peers
		// (reachPeers); this test is of one registered while cut off,
		// as one cut off right after it reached them is.
		c.noReachGate = true
	})
	for id := 1; id <= 5; id++ {
		c.startCfg(id, func(cfg *Config) { cfg.knobs.feedDialWait = dialWait })
	}
	onX := partitionsOn(t, c, NodeName(x))
	with := map[int]uint32{}
	for y := 1; y <= 5; y++ {
		if y == x {
			continue
		}
		for p := range partitionsOn(t, c, NodeName(y)) {
			if onX[p] {
				with[y] = p
			}
		}
	}
	if len(with) < 3 {
		t.Fatalf("fewer than three nodes hold a partition with n%d: %v", x, with)
	}
	cl := dialClient(t, c.direct(1))
	waitWritable(t, cl, parts)
	c.stop(x)
	thaw := freezeAll(c.pathsOf(x))
	defer thaw()
	c.startCfg(x, func(cfg *Config) { cfg.knobs.feedDialWait = dialWait })
	waitUntil(t, 20*time.Second, "x's new process fenced", func() bool { return fenceStands(c, NodeName(x)) })
	fenced := time.Now()
	clients := map[int]*rawClient{}
	for y := range with {
		clients[y] = dialClient(t, c.direct(y))
	}
	var mu sync.Mutex
	var slowest time.Duration
	var wg sync.WaitGroup
	for y, p := range with {
		wg.Go(func() {
			err := writeWithin(clients[y], p, fmt.Sprintf("after-fence-%d", y), 20*time.Second)
			took := time.Since(fenced)
			t.Logf("first write of partition %d through n%d: %v after n%d's fence stood (%v)", p, y, took.Round(time.Millisecond), x, err)
			mu.Lock()
			slowest = max(slowest, took)
			mu.Unlock()
		})
	}
	wg.Wait()
	if slowest > time.Second {
		t.Errorf("the writes through the nodes holding a partition with n%d came up to %v after its fence, want within 1 s", x, slowest.Round(time.Millisecond))
	}
	thaw()
	waitSettled(t, c, cl, parts, 3)
	checkDigests(t, cl, parts, 3)
}

// TestFencedHealedAtOnceRegisters: a process fenced by its peers while
// cut from them, healed at once, registers again. Its feeds, dialled
// while it was cut, open as the cut heals, before the process has seen
// its registration end; a feed counts in its gate (mayRegister) only if
// it opened since the term ended or was answered wire.Fenced. The peers
// had taken the process for dead (its fence stood) and yet answered a
// first feed of that process with a plain floor, as they answer a new
// process, so nothing in the gate counted, nothing reopened the feeds,
// and the process never registered again (TestDialEndsAtTheFence healed
// at once: 2 runs of 5).
func TestFencedHealedAtOnceRegisters(t *testing.T) {
	const parts = 4
	const x = 3
	// The cut heals as the last peer takes x's new process for dead,
	// with x's dials held by the cut: they open at once, before x sees
	// its registration end, about 100 ms later.
	var mu sync.Mutex
	var thaw func()
	var healed time.Time
	tookDead := map[int]bool{}
	c := newClusterWith(t, 3, 0, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
		// A new process registers only once it reaches its peers
		// (reachPeers); this test is of one registered while cut off,
		// as one cut off right after it reached them is.
		c.noReachGate = true
		c.onLog = func(id int, r slog.Record) {
			if id == x || r.Message != "process fenced by its peers' reports: taken for dead here" {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			tookDead[id] = true
			if len(tookDead) == 2 && thaw != nil {
				thaw()
				thaw, healed = nil, time.Now()
			}
		}
	})
	for id := 1; id <= 3; id++ {
		c.startCfg(id, nil)
	}
	cl := dialClient(t, c.direct(1))
	waitWritable(t, cl, parts)
	c.stop(x)
	unfreeze := freezeAll(c.pathsOf(x))
	defer unfreeze() // if the peers never took x for dead
	mu.Lock()
	thaw = unfreeze
	mu.Unlock()
	c.startCfg(x, nil)
	waitUntil(t, 20*time.Second, "the peers took x's new process for dead, and the cut healed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !healed.IsZero()
	})
	waitRegistered(t, c, NodeName(x), true, 20*time.Second, "x's process registered again after the heal")
	t.Logf("n%d registered again %v after the heal", x, time.Since(healed).Round(time.Millisecond))
	waitSettled(t, c, cl, parts, 3)
	checkDigests(t, cl, parts, 3)
}
