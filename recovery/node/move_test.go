package node

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/nodestate"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/wire"
)

// liveCounts reads each partition's live replicas from etcd: a live
// record on a registered node.
func liveCounts(ctx context.Context, c *cluster) (map[uint32]int, error) {
	nodes, err := supervise.Nodes(ctx, c.admin)
	if err != nil {
		return nil, err
	}
	up := map[string]bool{}
	for _, n := range nodes {
		up[n.ID] = true
	}
	reps, err := supervise.Replicas(ctx, c.admin)
	if err != nil {
		return nil, err
	}
	out := map[uint32]int{}
	for _, r := range reps {
		if up[r.Node] && r.State == recovery.ReplicaLive {
			out[r.Partition]++
		}
	}
	return out, nil
}

// runMoves runs move passes of plan until it says done, within d.
func runMoves(t *testing.T, c *cluster, what string, plan supervise.Planner, d time.Duration) (started, finished int) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		evs, done, err := supervise.MovePass(ctx, c.admin, plan, time.Now())
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for _, ev := range evs {
			if ev.Waiting != "" {
				continue // a move under way, neither started nor ended here
			}
			if ev.Cancelled {
				t.Fatalf("%s: move cancelled: %+v", what, ev)
			}
			if ev.Finished {
				finished++
			} else {
				started++
			}
			t.Logf("%s: %+v", what, ev)
		}
		if done {
			return started, finished
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not done in %s (%d moves started, %d finished)", what, d, started, finished)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRebalanceAndDrainUnderWrites: four partitions, two replicas, on
// n1..n3; n4 starts empty. Under a writer, a rebalance moves replicas
// onto n4 until the counts are within one, then a drain moves every
// replica off n3, each move a rejoin onto a running node and then the
// removal of the old replica. Sampled throughout, no partition has fewer
// live replicas than the two it started with; at the end every replica
// of each partition has the same digest, every acknowledged write is on
// every replica, n3 hosts nothing and n4 hosts its share.
func TestRebalanceAndDrainUnderWrites(t *testing.T) {
	const parts = 4
	cfg := layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}}
	c := newClusterStarting(t, 3, 3, cfg)
	c.start(4)
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, parts)
	for i := range 400 {
		upsert(t, cl, parts, i)
	}

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	// The sampler: the fewest live replicas any partition had.
	var fewest atomic.Int64
	fewest.Store(int64(cfg.Replicas))
	var samples atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			live, err := liveCounts(rctx, c)
			cancel()
			if err == nil {
				samples.Add(1)
				for p := range uint32(parts) {
					if n := int64(live[p]); n < fewest.Load() {
						fewest.Store(n)
						t.Logf("partition %d: %d live replicas", p, n)
					}
				}
			}
			select {
			case <-time.After(20 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}()
	// The writer: on its own connection to n2, which neither move drains.
	wcl := dialClient(t, c.nodes[2].addrs.TCP)
	var acked []int
	var failed int
	wdone := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(wdone)
		for i := 1000; i < 1000+20000 && ctx.Err() == nil; i++ {
			key := wire.Bytes(fmt.Appendf(nil, "key-%06d", i))
			p, err := partition.RouteValues([]wire.Value{key}, parts)
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := wcl.call(p, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes(fmt.Appendf(nil, "value-%d.", i))); err != nil {
				failed++
				continue
			}
			acked = append(acked, i)
			time.Sleep(2 * time.Millisecond)
		}
	}()

	// The rebalance runs its two moves onto n4 at once; the drain one
	// partition at a time.
	rs, rf := runMoves(t, c, "rebalance", func(s supervise.MoveState) ([]supervise.Move, bool, error) {
		return supervise.PlanRebalance(s, supervise.MoveLimits{InFlightMax: 2, IncomingMax: 2})
	}, 90*time.Second)
	ds, df := runMoves(t, c, "drain n3", func(s supervise.MoveState) ([]supervise.Move, bool, error) {
		return supervise.PlanDrain(s, NodeName(3), supervise.MoveLimits{InFlightMax: 1, IncomingMax: 1})
	}, 90*time.Second)
	if rs == 0 || rs != rf || ds == 0 || ds != df {
		t.Fatalf("rebalance started %d moves and finished %d, drain %d and %d: want some, each finished", rs, rf, ds, df)
	}
	stop()
	<-wdone

	// n3 drops what it held; n4 holds its share, all live.
	waitUntil(t, 20*time.Second, "n3 to drop its replicas", func() bool { return len(nodeStatus(t, c.nodes[3].addrs).Replicas) == 0 })
	if st := nodeStatus(t, c.nodes[4].addrs); len(st.Replicas) < 2 {
		t.Fatalf("n4 holds %d replicas after the rebalance, want at least 2", len(st.Replicas))
	}
	waitUntil(t, 20*time.Second, "every replica live", func() bool { return allLive(t, c) })
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	live, err := liveCounts(rctx, c)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	for p := range uint32(parts) {
		if live[p] != cfg.Replicas {
			t.Fatalf("partition %d ends with %d live replicas, want %d", p, live[p], cfg.Replicas)
		}
	}
	if n := fewest.Load(); n < int64(cfg.Replicas) {
		t.Fatalf("a partition had %d live replicas during the moves, fewer than the %d before", n, cfg.Replicas)
	}
	checkDigests(t, cl, parts, cfg.Replicas)
	// Every acknowledged write is on every replica.
	for _, i := range acked {
		key := wire.Bytes(fmt.Appendf(nil, "key-%06d", i))
		p, _ := partition.RouteValues([]wire.Value{key}, parts)
		r, err := cl.call(p, partition.ProcRead, true, wire.String("kv"), key)
		if err != nil {
			t.Fatalf("read acknowledged write %d: %v", i, err)
		}
		if len(r.Each) != cfg.Replicas {
			t.Fatalf("write %d: %d replicas answered", i, len(r.Each))
		}
		for _, e := range r.Each {
			if !bytes.Contains(e.Out, fmt.Appendf(nil, "value-%d.", i)) {
				t.Fatalf("acknowledged write %d lost on %s: read %q", i, e.Node, e.Out)
			}
		}
	}
	t.Logf("moves: rebalance %d, drain %d; writes acknowledged %d, failed %d; %d samples of the live replicas", rs, ds, len(acked), failed, samples.Load())
	if len(acked) == 0 {
		t.Fatal("no write acknowledged during the moves")
	}
}

// TestPlacedWaitsForEveryView: a replica placed on the node at some
// revision opens its rejoin only once every other running node's record
// says its view is at or past that revision, and the node's own view is;
// a replica with no placement revision waits for nothing.
func TestPlacedWaitsForEveryView(t *testing.T) {
	n := &Node{id: "n3"}
	n.members.v = &view{rev: 41, nodes: map[string]supervise.NodeRecord{"n1": {ViewRev: 40}, "n2": {ViewRev: 41}, "n3": {}}}
	if !n.placedSeen(&replica{}) {
		t.Fatal("a replica with no placement revision waits")
	}
	r := &replica{placedAt: 41}
	if n.placedSeen(r) {
		t.Fatal("opened with n1's view at 40, before the move's 41")
	}
	n.members.v = &view{rev: 41, nodes: map[string]supervise.NodeRecord{"n1": {ViewRev: 41}, "n2": {ViewRev: 41}, "n3": {}}}
	if !n.placedSeen(r) {
		t.Fatal("every view at 41 (the node's own read directly, not from its lagging record): still waits")
	}
	n.members.v = &view{rev: 40, nodes: map[string]supervise.NodeRecord{"n1": {ViewRev: 41}, "n2": {ViewRev: 41}, "n3": {ViewRev: 41}}}
	if n.placedSeen(r) {
		t.Fatal("opened with the node's own view at 40")
	}
}

// TestRestartedDuringMoveWaitsForViews: a node that starts hosting a
// replica a move placed on it just before (the node restarted during the
// move) gives it the record's revision, so its rejoin waits for every
// view to show it, as one moved in while the node ran does. It used to
// wait for nothing: only replicas created by reconcile had a revision.
func TestRestartedDuringMoveWaitsForViews(t *testing.T) {
	cli, ctx := testEtcd(t, 10*time.Second)
	n := testNode(t, t.TempDir())
	n.id, n.cli = "n3", cli
	// Partition 0 placed on n3 from the start; partition 1 moved onto n3
	// later.
	if err := supervise.SetReplicas(ctx, cli, []supervise.Replica{
		{Partition: 0, Node: "n1", State: recovery.ReplicaLive}, {Partition: 0, Node: "n3", State: recovery.ReplicaLive},
		{Partition: 1, Node: "n1", State: recovery.ReplicaLive}, {Partition: 1, Node: "n2", State: recovery.ReplicaLive},
	}); err != nil {
		t.Fatal(err)
	}
	if err := supervise.SetReplicas(ctx, cli, []supervise.Replica{{Partition: 1, Node: "n3", State: recovery.ReplicaNeedsRejoin}}); err != nil {
		t.Fatal(err)
	}
	reps, err := supervise.Replicas(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	var initRev, moveRev int64
	for _, rp := range reps {
		switch {
		case rp.Partition == 0 && rp.Node == "n3":
			initRev = rp.Created
		case rp.Partition == 1 && rp.Node == "n3":
			moveRev = rp.Created
		}
	}
	if initRev == 0 || moveRev <= initRev {
		t.Fatalf("records created at %d and %d, want the move's later", initRev, moveRev)
	}
	if err := n.hostReplicas(ctx, nodestate.StartReport{First: true}); err != nil {
		t.Fatal(err)
	}
	// n1 sequences with a view from between the two revisions.
	n.members.v = &view{rev: moveRev, nodes: map[string]supervise.NodeRecord{"n1": {ViewRev: moveRev - 1}, "n2": {ViewRev: moveRev}, "n3": {}}}
	h := n.hosted()
	if r := h[0]; r == nil || !n.placedSeen(r) {
		t.Fatal("partition 0, placed at the start, waits for a view past it")
	}
	if r := h[1]; r == nil || n.placedSeen(r) {
		t.Fatalf("partition 1, moved here at %d, opens with n1's view at %d", moveRev, moveRev-1)
	}
}

// TestViewBehindRegistration: a node whose view is older than its
// registration's record (back from a lapse, the view frozen meanwhile)
// sequences nothing until the view catches up.
func TestViewBehindRegistration(t *testing.T) {
	cli, ctx := testEtcd(t, 10*time.Second)
	reg, err := supervise.Register(ctx, cli, "n1", supervise.NodeOptions{TTL: 2 * time.Second, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Close(ctx) }()
	n := &Node{reg: reg}
	created := reg.Term().Created
	if !n.viewBehindTerm(&view{rev: created - 1}) {
		t.Fatalf("a view at %d, before the registration at %d, is not behind", created-1, created)
	}
	if n.viewBehindTerm(&view{rev: created}) {
		t.Fatalf("a view at the registration's revision %d is behind", created)
	}
}

// TestReconcileReplacesPlacedAgain: a replica whose record was removed
// and placed on the node again (a move off it, then one back, between two
// views) is dropped and created anew, needs-rejoin, with the new record's
// revision. A view that never showed the gap kept the old replica, live,
// and the new record waited forever for a rejoin (issue 28); a record
// unchanged keeps its replica.
func TestReconcileReplacesPlacedAgain(t *testing.T) {
	n := testNode(t, t.TempDir())
	old, err := newReplica(n, 3, true)
	if err != nil {
		t.Fatal(err)
	}
	old.created = 10
	kept, err := newReplica(n, 4, true)
	if err != nil {
		t.Fatal(err)
	}
	kept.created = 11
	n.replicas.Store(&map[uint32]*replica{3: old, 4: kept})
	n.goRun(old.loop)
	n.goRun(kept.loop)
	n.reconcile(&view{bootstrapped: true, rev: 30, placement: map[uint32][]replicaPlace{
		3: {{node: "n1", live: true}, {node: n.id, created: 25}},
		4: {{node: "n1", live: true}, {node: n.id, live: true, created: 11}},
	}})
	h := n.hosted()
	if h[4] != kept {
		t.Fatal("partition 4, its record unchanged, was replaced")
	}
	r := h[3]
	if r == nil || r == old {
		t.Fatalf("partition 3, placed again at 25 after the record of 10, kept its old replica (%p, old %p)", r, old)
	}
	if r.created != 25 || r.placedAt != 30 {
		t.Fatalf("the new replica of partition 3: created %d, placed at %d; want 25, 30", r.created, r.placedAt)
	}
	select {
	case <-old.gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the old replica's loop did not end")
	}
	if live, ok := ask(r, func(r *replica) bool { return r.core.State() == recovery.ReplicaLive }); !ok || live {
		t.Fatalf("the new replica of partition 3 is live (%v, answered %v): it must rejoin", live, ok)
	}
}
