package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/nodestate"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// testNode is a Node with just what a replica's destination side needs,
// no etcd and no goroutine of its own: the test is the replica's
// goroutine. Its record lives in dir.
func testNode(t testing.TB, dir string) *Node {
	t.Helper()
	s, err := layout.KV().Schema()
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{id: "n9", log: testLog(t), limited: newLimitedLog(testLog(t), logEveryDefault), schemas: []partition.Schema{s}, procs: partition.NewBuiltinRegistry()}
	ctx, cancel := context.WithCancel(context.Background())
	n.ctx = ctx
	n.members.n = n
	n.metrics = newMetrics(n)
	store, _, err := nodestate.Open(dir, n.id, time.Now(), n.log)
	if err != nil {
		t.Fatal(err)
	}
	n.store = store
	t.Cleanup(func() {
		cancel()
		n.wg.Wait()
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	})
	return n
}

func testReplica(t *testing.T, n *Node, p uint32) *replica {
	t.Helper()
	r, err := newReplica(n, p, false)
	if err != nil {
		t.Fatal(err)
	}
	r.core.AddInitiator(1)
	return r
}

// TestDestFenceAcrossAttempts: once an attempt of epoch E has started on
// a destination, no attempt at or below E starts there again: not after
// the attempt ended, and not after the node restarted.
func TestDestFenceAcrossAttempts(t *testing.T) {
	dir := t.TempDir()
	n := testNode(t, dir)
	r := testReplica(t, n, 4)
	att, err := r.startDest("n1", 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.startDest("n1", 9); err == nil {
		t.Fatal("epoch 9 started during the attempt of 10")
	}
	if again, err := r.startDest("n1", 10); err != nil || again != att {
		t.Fatalf("resuming epoch 10: %v (same attempt %v)", err, again == att)
	}
	if _, err := r.startDest("n2", 10); err == nil {
		t.Fatal("another node resumed the attempt of epoch 10")
	}
	r.abortDest(att, wire.AbortTimeout, "test")
	if r.dst != nil || r.core.State() != recovery.ReplicaNeedsRejoin {
		t.Fatalf("attempt not ended: state %s", r.core.State())
	}
	for _, e := range []uint64{10, 9} {
		if _, err := r.startDest("n1", e); err == nil {
			t.Fatalf("epoch %d started after the attempt of 10 ended", e)
		}
	}
	att, err = r.startDest("n1", 11)
	if err != nil {
		t.Fatal(err)
	}
	if high, err := n.store.HighestEpoch(4); err != nil || high != 11 {
		t.Fatalf("recorded epoch %d, %v, want 11", high, err)
	}
	r.abortDest(att, wire.AbortShutdown, "test")

	// A restart: a new record handle, a new replica.
	n.wg.Wait()
	if err := n.store.Close(); err != nil {
		t.Fatal(err)
	}
	n2 := testNode(t, dir)
	r2 := testReplica(t, n2, 4)
	if _, err := r2.startDest("n1", 11); err == nil || !strings.Contains(err.Error(), "not above 11") {
		t.Fatalf("epoch 11 after a restart: %v", err)
	}
	att, err = r2.startDest("n1", 12)
	if err != nil {
		t.Fatal(err)
	}
	r2.abortDest(att, wire.AbortShutdown, "test")
}

// TestSelfTermination: a destination attempt ends when any node whose
// replica of the partition was live at its start fails (record gone, or
// replica no longer live), not only its source; a node that was already
// down, or the destination itself, does not end it.
func TestSelfTermination(t *testing.T) {
	n := testNode(t, t.TempDir())
	rec := func(ids ...string) map[string]supervise.NodeRecord {
		m := map[string]supervise.NodeRecord{}
		for _, id := range ids {
			m[id] = supervise.NodeRecord{ID: id}
		}
		return m
	}
	// Partition 4 on n1 (source), n2, n3 (down, its replica needs a
	// rejoin) and n9 (this node, the destination).
	start := &view{nodes: rec("n1", "n2", "n9"), placement: map[uint32][]replicaPlace{4: {
		{node: "n1", live: true}, {node: "n2", live: true}, {node: "n3"}, {node: "n9"},
	}}}
	n.members.v = start
	r := testReplica(t, n, 4)
	begin := func(epoch uint64) *dstAttempt {
		t.Helper()
		att, err := r.startDest("n1", epoch)
		if err != nil {
			t.Fatal(err)
		}
		return att
	}
	att := begin(1)
	if got := strings.Join(att.watch, ","); got != "n1,n2" {
		t.Fatalf("watching %q, want n1,n2", got)
	}
	r.checkPeers(start)
	// n3 coming back, rejoining, is no failure; nor is n9's own state.
	back := &view{nodes: rec("n1", "n2", "n3", "n9"), placement: start.placement}
	r.checkPeers(back)
	if r.dst != att || att.proc.State().Final() {
		t.Fatalf("attempt ended by nodes that were not live at its start: %v", att.proc.Err())
	}

	for _, tc := range []struct {
		name string
		v    *view
	}{
		{"n2's record gone", &view{nodes: rec("n1", "n9"), placement: start.placement}},
		{"n2's replica not live", &view{nodes: rec("n1", "n2", "n9"), placement: map[uint32][]replicaPlace{4: {
			{node: "n1", live: true}, {node: "n2"}, {node: "n3"}, {node: "n9"},
		}}}},
	} {
		r.checkPeers(tc.v)
		if r.dst != nil || att.proc.State() != recovery.StateAborted {
			t.Fatalf("%s: attempt still %v", tc.name, att.proc.State())
		}
		var ae *recovery.AbortError
		if err := att.proc.Err(); !errors.As(err, &ae) || ae.Reason != wire.AbortNodeFailed || !strings.Contains(err.Error(), "n2") {
			t.Fatalf("%s: ended with %v, want a node failure naming n2", tc.name, err)
		}
		// The fresh attempt starts once n2 is gone: it watches n1 only,
		// and lives on.
		n.members.v = tc.v
		att = begin(att.epoch + 1)
		if got := strings.Join(att.watch, ","); got != "n1" {
			t.Fatalf("%s: fresh attempt watches %q", tc.name, got)
		}
		r.checkPeers(tc.v)
		if r.dst != att || att.proc.State().Final() {
			t.Fatalf("%s: the fresh attempt ended: %v", tc.name, att.proc.Err())
		}
		r.abortDest(att, wire.AbortShutdown, "next case")
		n.members.v = start
		att = begin(att.epoch + 1)
	}
	r.abortDest(att, wire.AbortShutdown, "test over")
}

// TestHelloChecksNode: a dialer refuses a hello answered by another node
// than the one it dialled (an address taken over by another process).
func TestHelloChecksNode(t *testing.T) {
	ln, err := stream.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		served <- func() error {
			for range 2 {
				nc, err := ln.Accept()
				if err != nil {
					return err
				}
				c := stream.NewConn(nc, stream.Config{Codec: wire.CodecNone})
				if _, err := c.Recv(); err != nil {
					c.Close()
					return err
				}
				err = c.Send(context.Background(), &wire.Hello{Kind: wire.HelloFeed, Node: "n5"})
				// The dialer closes: wait for it, bounded by its close.
				_, _ = c.Recv()
				c.Close()
				if err != nil {
					return err
				}
			}
			return nil
		}()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		want string
		ok   bool
	}{{"n2", false}, {"n5", true}} {
		c, err := stream.Dial(ctx, ln.Addr().String(), stream.Config{Codec: wire.CodecNone})
		if err != nil {
			t.Fatal(err)
		}
		err = hello(ctx, c, &wire.Hello{Kind: wire.HelloFeed, Node: "n1", Initiator: 1}, tc.want)
		c.Close()
		if (err == nil) != tc.ok {
			t.Fatalf("dialling %s, answered by n5: %v", tc.want, err)
		}
		if err != nil && !strings.Contains(err.Error(), `"n5", not "n2"`) {
			t.Fatalf("error %v does not name both nodes", err)
		}
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

// TestRejoinHelloChecksClaim: the destination serves a rejoin hello only
// from the node that holds the task's claim in etcd, at the claim's epoch.
func TestRejoinHelloChecksClaim(t *testing.T) {
	c := newCluster(t, 2, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	task := claim.Task{Partition: 0, Dest: NodeName(2)}
	rejoinHello := func(node string, epoch uint64) error {
		// Each name dials with its own certificate: the claim is the check.
		num, _ := strconv.Atoi(strings.TrimPrefix(node, "n"))
		conn := dialAs(t, ctx, c.nodes[2].addrs.TCP, certs.NodeID(num), NodeName(2))
		defer conn.Close()
		return hello(ctx, conn, &wire.Hello{Kind: wire.HelloRejoin, Node: node, Partition: 0, Epoch: epoch}, NodeName(2))
	}
	if err := rejoinHello("n1", 1); err == nil || !strings.Contains(err.Error(), "no claim") {
		t.Fatalf("no claim: %v", err)
	}
	cl, err := claim.Acquire(ctx, c.admin, task, supervise.ExecutorID("n1"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Release(ctx) }()
	e := cl.Epoch()
	for _, tc := range []struct {
		node  string
		epoch uint64
	}{{"n3", e}, {"n1", e - 1}, {"n1", e + 1}} {
		if err := rejoinHello(tc.node, tc.epoch); err == nil || !strings.Contains(err.Error(), "the claim on task") {
			t.Fatalf("%s at epoch %d, claim n1's at %d: %v", tc.node, tc.epoch, e, err)
		}
	}
	// The holder, but of a claim no assignment gave it: refused too
	// (TestRejoinNeedsClaimAndCertificate; every rejoin of the other
	// tests passes with its assignment).
	if err := rejoinHello("n1", e); err == nil || !strings.Contains(err.Error(), "the supervisor assigned it to nobody") {
		t.Fatalf("the holder without an assignment: %v", err)
	}
}

// TestPartitionNodeFailureEndsRejoin (DESIGN.md step 8): three
// replicas; n3 rejoins from a source held mid-snapshot; the third node,
// neither source nor destination, stops. The destination ends its
// attempt, the failure handling starts a fresh one with a higher epoch,
// and it completes with the source's digest.
func TestPartitionNodeFailureEndsRejoin(t *testing.T) {
	c := newCluster(t, 3, layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}})
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
	var src, other int
	var held RejoinStatus
	waitUntil(t, 20*time.Second, "a source to hold mid-snapshot", func() bool {
		for _, id := range []int{1, 2} {
			st := nodeStatus(t, c.nodes[id].addrs)
			if len(st.Replicas[0].Sources) == 1 && st.Replicas[0].Sources[0].Held {
				src, other, held = id, 3-id, st.Replicas[0].Sources[0]
				return true
			}
		}
		return false
	})
	c.stop(other)
	var ended RejoinStatus
	waitUntil(t, 20*time.Second, "the destination to end its attempt", func() bool {
		r := nodeStatus(t, a3).Replicas[0].Rejoin
		if r != nil && r.Epoch == held.Epoch && r.Err != "" {
			ended = *r
			return true
		}
		return false
	})
	if !strings.Contains(ended.Err, fmt.Sprintf("node %s of partition 0 failed", NodeName(other))) {
		t.Fatalf("attempt %d ended with %q", ended.Epoch, ended.Err)
	}
	fault(t, c.nodes[src].addrs, "/fault/release?partition=0")
	var live RejoinStatus
	waitUntil(t, 40*time.Second, "n3 live", func() bool {
		st := nodeStatus(t, a3).Replicas[0]
		if st.State == recovery.ReplicaLive && st.Rejoin != nil {
			live = *st.Rejoin
			return true
		}
		return false
	})
	t.Logf("held attempt %d ended: %s; live by attempt %d from %s", held.Epoch, ended.Err, live.Epoch, live.Peer)
	if live.Epoch <= held.Epoch {
		t.Fatalf("n3 went live by epoch %d, not above the held attempt's %d", live.Epoch, held.Epoch)
	}
	cls := dialClient(t, c.nodes[src].addrs.TCP)
	for i := range 100 {
		upsert(t, cls, 1, i)
	}
	checkDigests(t, cls, 1, 2)
}

// TestSuspectsKeepAnUntrackedSilence: a process taken for dead here (its
// latest feed untracked: its tail repaired) and alive in the membership
// again, with no feed here since, is a suspect as soon as it has been
// silent for suspectAfter since its feed went silent, not suspectAfter
// after this node first looks. Counted from the first look, the report
// filed on the lost feed was withdrawn at the repair and filed again
// 1.5 s later (chaos seed 175139113: a node that registered again while
// cut off outlasted a 4.2 s cut unfenced).
func TestSuspectsKeepAnUntrackedSilence(t *testing.T) {
	now := time.Now()
	started := now.Add(-time.Minute)
	inc := started.UnixNano()
	feed := func(silentFor time.Duration) *feedIn {
		fi := &feedIn{in: 2, node: "n2", inc: uint64(inc), resolved: make(chan struct{}), untracked: true}
		fi.silentSince.Store(now.Add(-silentFor).UnixNano())
		close(fi.resolved)
		return fi
	}
	v := &view{nodes: map[string]supervise.NodeRecord{"n1": {ID: "n1", Started: now}, "n2": {ID: "n2", Started: started}}}

	n := &Node{id: "n1"}
	n.feeds.last = map[txnid.Initiator]*feedIn{2: feed(2 * time.Second)}
	unfed := map[string]time.Time{}
	if got := n.suspects(now, time.Time{}, v, unfed); got["n2"] != inc {
		t.Errorf("silent 2 s, its feed untracked: suspects %v, want n2 at once", got)
	}

	n.feeds.last = map[txnid.Initiator]*feedIn{2: feed(time.Second)}
	unfed = map[string]time.Time{}
	if got := n.suspects(now, time.Time{}, v, unfed); len(got) != 0 {
		t.Errorf("silent 1 s: suspects %v, want none yet", got)
	}
	if got := n.suspects(now.Add(suspectAfter-time.Second), time.Time{}, v, unfed); got["n2"] != inc {
		t.Errorf("silent %v: suspects %v, want n2", suspectAfter, got)
	}

	// A process that never fed this node is counted from the first look.
	v.nodes["n3"] = supervise.NodeRecord{ID: "n3", Started: started}
	unfed = map[string]time.Time{}
	if got := n.suspects(now, time.Time{}, v, unfed); got["n3"] != 0 {
		t.Errorf("n3 first seen now: suspects %v, want n3 not yet", got)
	}
	if got := n.suspects(now.Add(suspectAfter), time.Time{}, v, unfed); got["n3"] != inc {
		t.Errorf("n3 unfed for %v: suspects %v, want n3", suspectAfter, got)
	}
}

// TestSuspectsCountFromTheRegistration: a node registered again (after
// a fence or a lapse) was out of its peers' view, and they dialled it
// no feed meanwhile; a feed of theirs lost before it registered is no
// sign against them until suspectAfter has passed since it registered.
// Counted from the feed's loss, a fenced node back on one side of a
// split reported the nodes of its own side at once, and the other
// side's reports with its own fenced them (TestFencedNodeBackOnTheMajoritySide).
func TestSuspectsCountFromTheRegistration(t *testing.T) {
	now := time.Now()
	started := now.Add(-time.Minute)
	inc := started.UnixNano()
	fi := &feedIn{in: 2, node: "n2", inc: uint64(inc), resolved: make(chan struct{})}
	fi.silentSince.Store(now.Add(-10 * time.Second).UnixNano())
	v := &view{nodes: map[string]supervise.NodeRecord{"n1": {ID: "n1", Started: now}, "n2": {ID: "n2", Started: started}, "n3": {ID: "n3", Started: started}}}
	n := &Node{id: "n1"}
	n.feeds.last = map[txnid.Initiator]*feedIn{2: fi}
	unfed := map[string]time.Time{"n3@" + strconv.FormatInt(inc, 10): now.Add(-10 * time.Second)}
	registered := now.Add(-time.Second)
	if got := n.suspects(now, registered, v, unfed); len(got) != 0 {
		t.Errorf("registered 1 s ago, n2's feed silent 10 s, n3 unfed 10 s: suspects %v, want none yet", got)
	}
	if got := n.suspects(registered.Add(suspectAfter), registered, v, unfed); got["n2"] != inc || got["n3"] != inc {
		t.Errorf("registered %v ago: suspects %v, want n2 and n3", suspectAfter, got)
	}
}

// TestSuspectsEndedAndQuiet: a process whose feed here ended by a close
// or a reset, not taken up since, and whose record has stood unchanged
// for recordQuiet while this node's own moved on, is a suspect at once,
// not suspectAfter after the end: a killed process. One whose record
// moved after the end lives and reaches etcd (a reset between nodes),
// one whose feed stalled may be paused, and a view whose own record
// stands still says nothing: each waits suspectAfter.
func TestSuspectsEndedAndQuiet(t *testing.T) {
	now := time.Now()
	started := now.Add(-time.Minute)
	inc := started.UnixNano()
	v := &view{nodes: map[string]supervise.NodeRecord{"n1": {ID: "n1", Started: now}, "n2": {ID: "n2", Started: started}}}
	type tc struct {
		name              string
		endedFor, stalled time.Duration // one of the two
		n2Touched         time.Duration // ago
		n1Touched         time.Duration
		taken             bool // a redial took the feed up
		want              bool
	}
	for _, c := range []tc{
		{name: "killed", endedFor: 300 * time.Millisecond, n2Touched: recordQuiet + 100*time.Millisecond, n1Touched: 50 * time.Millisecond, want: true},
		{name: "record moved since the end", endedFor: 300 * time.Millisecond, n2Touched: 100 * time.Millisecond, n1Touched: 50 * time.Millisecond},
		{name: "record quiet, but ended just now", endedFor: 50 * time.Millisecond, n2Touched: time.Second, n1Touched: 50 * time.Millisecond},
		{name: "own record quiet too", endedFor: 300 * time.Millisecond, n2Touched: time.Second, n1Touched: time.Second},
		{name: "stalled, not ended", stalled: 300 * time.Millisecond, n2Touched: time.Second, n1Touched: 50 * time.Millisecond},
		{name: "taken up by a redial", endedFor: 300 * time.Millisecond, n2Touched: time.Second, n1Touched: 50 * time.Millisecond, taken: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			fi := &feedIn{in: 2, node: "n2", inc: uint64(inc), resolved: make(chan struct{})}
			if c.taken {
				close(fi.resolved)
			}
			if c.endedFor > 0 {
				fi.endedAt.Store(now.Add(-c.endedFor).UnixNano())
				fi.silentSince.Store(now.Add(-c.endedFor).UnixNano())
			} else {
				fi.silentSince.Store(now.Add(-c.stalled - feedStallWindow).UnixNano())
			}
			n := &Node{id: "n1"}
			n.members.touchedAt = map[string]time.Time{"n1": now.Add(-c.n1Touched), "n2": now.Add(-c.n2Touched)}
			n.feeds.last = map[txnid.Initiator]*feedIn{2: fi}
			got, quick := n.suspectsWhy(now, time.Time{}, v, map[string]time.Time{})
			if (got["n2"] == inc) != c.want || quick["n2"] != c.want {
				t.Errorf("suspects %v (quick %v), want n2: %v", got, quick, c.want)
			}
		})
	}
}
