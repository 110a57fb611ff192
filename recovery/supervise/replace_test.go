package supervise

import (
	"errors"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
)

// placeTest records a placement of parts partitions, 2 replicas each, on
// nodes, every replica live, and returns it.
func placeTest(t *testing.T, cli *clientv3.Client, nodes []string, parts uint32) map[uint32][]string {
	t.Helper()
	place, err := Place(nodes, parts, 2)
	if err != nil {
		t.Fatal(err)
	}
	var rs []Replica
	for p, ns := range place {
		for _, n := range ns {
			rs = append(rs, Replica{Partition: p, Node: n, State: recovery.ReplicaLive})
		}
	}
	if err := SetReplicas(testCtx(t, 10*time.Second), cli, rs); err != nil {
		t.Fatal(err)
	}
	return place
}

// placementOf reads the placement back: partition -> node -> state.
func placementOf(t *testing.T, cli *clientv3.Client) map[uint32]map[string]recovery.ReplicaState {
	t.Helper()
	reps, err := Replicas(testCtx(t, 10*time.Second), cli)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint32]map[string]recovery.ReplicaState{}
	for _, r := range reps {
		if out[r.Partition] == nil {
			out[r.Partition] = map[string]recovery.ReplicaState{}
		}
		out[r.Partition][r.Node] = r.State
	}
	return out
}

// TestReplace: a dead node's replicas move to a new node, recorded
// needs-rejoin, in several transactions, with the records of rejoins onto
// the dead node; a running node, a clash and a second run are refused
// with nothing changed; and the cluster stays bootstrapped although the
// new node never started.
func TestReplace(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 30*time.Second)
	const parts = 40
	nodes := []string{"n1", "n2", "n3"}
	place := placeTest(t, cli, nodes, parts)
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for _, n := range nodes {
		if _, err := Incarnate(ctx, cli, n, nodes, now); err != nil {
			t.Fatal(err)
		}
		if err := MarkRegistered(ctx, cli, n); err != nil {
			t.Fatal(err)
		}
	}
	var onN2 []uint32
	for p, ns := range place {
		if slices.Contains(ns, "n2") {
			onN2 = append(onN2, p)
		}
	}
	slices.Sort(onN2)
	if len(onN2) <= ReplaceTxnPartitionsMax {
		t.Fatalf("n2 hosts %d partitions: too few to need several transactions", len(onN2))
	}
	// A rejoin onto n2 under way, and one onto n1 that must stay.
	toN2 := claim.Task{Partition: onN2[0], Dest: "n2"}
	toN1 := claim.Task{Partition: onN2[0], Dest: "n1"}
	for _, k := range []string{toN2.RecordKey(), AssignmentKey(toN2), toN2.ClaimKey(), toN1.RecordKey()} {
		if _, err := cli.Put(ctx, k, "{}"); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := encode(NodeRecord{Address: "127.0.0.1:1", Started: now, LastActive: now, Status: NodeReady})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, NodeKey("n2"), rec); err != nil {
		t.Fatal(err)
	}
	before := placementOf(t, cli)

	if _, err := Replace(ctx, cli, "n2", "n4"); !errors.Is(err, ErrRunning) {
		t.Fatalf("replace of a registered node: %v, want ErrRunning", err)
	}
	if _, err := cli.Delete(ctx, NodeKey("n2")); err != nil {
		t.Fatal(err)
	}
	if _, err := Replace(ctx, cli, "n2", "n1"); !errors.Is(err, ErrPlacement) {
		t.Fatalf("replace onto a node hosting the same partitions: %v, want ErrPlacement", err)
	}
	if _, err := Replace(ctx, cli, "n2", "n2"); !errors.Is(err, ErrPlacement) {
		t.Fatalf("replace by itself: %v, want ErrPlacement", err)
	}
	if got := placementOf(t, cli); !equalPlacement(got, before) {
		t.Fatalf("a refused replace changed the placement:\n%v\nwas\n%v", got, before)
	}

	moved, err := Replace(ctx, cli, "n2", "n4")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(moved, onN2) {
		t.Fatalf("moved %v, want n2's partitions %v", moved, onN2)
	}
	after := placementOf(t, cli)
	for p := range uint32(parts) {
		for n, st := range before[p] {
			switch {
			case n == "n2":
				if _, ok := after[p]["n2"]; ok {
					t.Errorf("partition %d still placed on n2", p)
				}
				if after[p]["n4"] != recovery.ReplicaNeedsRejoin {
					t.Errorf("partition %d on n4: %q, want needs-rejoin", p, after[p]["n4"])
				}
			case after[p][n] != st:
				t.Errorf("partition %d on %s: %q, was %q", p, n, after[p][n], st)
			}
		}
		if len(after[p]) != 2 {
			t.Errorf("partition %d has %d replicas, want 2: %v", p, len(after[p]), after[p])
		}
	}
	for k, want := range map[string]int64{toN2.RecordKey(): 0, AssignmentKey(toN2): 0, toN2.ClaimKey(): 0, toN1.RecordKey(): 1} {
		resp, err := cli.Get(ctx, k, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count != want {
			t.Errorf("%s: %d keys after the replace, want %d", k, resp.Count, want)
		}
	}
	// n4 never started, yet the cluster holds writes: a node starting now
	// must not take its replicas for empty copies of an empty cluster.
	booted, err := Bootstrapped(ctx, cli, []string{"n1", "n3", "n4"})
	if err != nil {
		t.Fatal(err)
	}
	if !booted {
		t.Fatal("after the replace the cluster is taken for not bootstrapped: a restarting node would start its replicas live and empty")
	}
	inc, err := Incarnate(ctx, cli, "n1", []string{"n1", "n3", "n4"}, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !inc.Bootstrapped {
		t.Fatal("Incarnate after the replace: not bootstrapped")
	}
	if _, err := Replace(ctx, cli, "n2", "n4"); !errors.Is(err, ErrPlacement) {
		t.Fatalf("a second replace: %v, want ErrPlacement (nothing left on n2)", err)
	}
}

// TestReplaceBeforeBootstrap: a node of a cluster that never bootstrapped
// (it never started) is replaced: every copy is empty, the new node's
// replicas are live as the others are, and no bootstrap mark is written.
func TestReplaceBeforeBootstrap(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 30*time.Second)
	nodes := []string{"n1", "n2", "n3"}
	placeTest(t, cli, nodes, 6)
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for _, n := range nodes[:2] {
		if _, err := Incarnate(ctx, cli, n, nodes, now); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Replace(ctx, cli, "n3", "n4"); err != nil {
		t.Fatal(err)
	}
	for p, at := range placementOf(t, cli) {
		if st, ok := at["n4"]; ok && st != recovery.ReplicaLive {
			t.Errorf("partition %d on n4: %q, want live", p, st)
		}
	}
	resp, err := cli.Get(ctx, BootstrappedKey, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatal("bootstrap mark written for a cluster that never bootstrapped")
	}
	booted, err := Bootstrapped(ctx, cli, []string{"n1", "n2", "n4"})
	if err != nil {
		t.Fatal(err)
	}
	if booted {
		t.Fatal("bootstrapped before n4 ever started")
	}
}

func equalPlacement(a, b map[uint32]map[string]recovery.ReplicaState) bool {
	if len(a) != len(b) {
		return false
	}
	for p, at := range a {
		if len(at) != len(b[p]) {
			return false
		}
		for n, st := range at {
			if b[p][n] != st {
				return false
			}
		}
	}
	return true
}
