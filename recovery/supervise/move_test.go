package supervise

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
)

// moveState builds a MoveState: running nodes, then "p:node,node" for
// each partition's replicas (all live).
func moveState(nodes []string, placement ...string) MoveState {
	s := MoveState{Nodes: map[string]NodeRecord{}, Replicas: map[uint32][]Replica{}, Moves: map[uint32]Move{}}
	for _, n := range nodes {
		s.Nodes[n] = NodeRecord{ID: n, Status: NodeReady}
	}
	for _, pl := range placement {
		var p uint32
		var rest string
		if _, err := fmt.Sscanf(pl, "%d:%s", &p, &rest); err != nil {
			panic(err)
		}
		for _, n := range splitComma(rest) {
			s.Replicas[p] = append(s.Replicas[p], Replica{Partition: p, Node: n, State: recovery.ReplicaLive})
		}
	}
	return s
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := range len(s) + 1 {
		if i == len(s) || s[i] == ',' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

var oneAtATime = MoveLimits{InFlightMax: 1, IncomingMax: 1}

func TestPlanDrain(t *testing.T) {
	s := moveState([]string{"n1", "n2", "n3", "n4"}, "0:n1,n3", "1:n2,n3", "2:n1,n2", "3:n3,n4")
	// n4 holds fewest: it takes partition 0, the lowest on n3.
	got, done, err := PlanDrain(s, "n3", oneAtATime)
	if err != nil || done || !reflect.DeepEqual(got, []Move{{Partition: 0, From: "n3", To: "n4"}}) {
		t.Fatalf("one at a time: %v done %v err %v", got, done, err)
	}
	// Three at once, at most one onto a node: each goes to the least
	// loaded node that holds none of its partition.
	got, _, err = PlanDrain(s, "n3", MoveLimits{InFlightMax: 3, IncomingMax: 1})
	want := []Move{{Partition: 0, From: "n3", To: "n4"}, {Partition: 1, From: "n3", To: "n1"}, {Partition: 3, From: "n3", To: "n2"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("three at once: %v, want %v (err %v)", got, want, err)
	}
	// A move under way counts against the limit and is not planned again.
	s.Moves[0] = Move{Partition: 0, From: "n3", To: "n4"}
	s.Replicas[0] = append(s.Replicas[0], Replica{Partition: 0, Node: "n4", State: recovery.ReplicaNeedsRejoin})
	if got, done, err := PlanDrain(s, "n3", oneAtATime); err != nil || done || len(got) != 0 {
		t.Fatalf("with one under way: %v done %v err %v", got, done, err)
	}
	// Two in flight: the next goes, but not onto n4, which takes one at once.
	got, _, err = PlanDrain(s, "n3", MoveLimits{InFlightMax: 2, IncomingMax: 1})
	if err != nil || !reflect.DeepEqual(got, []Move{{Partition: 1, From: "n3", To: "n1"}}) {
		t.Fatalf("second beside the first: %v err %v", got, err)
	}
	// n4 is empty and would take them all, but takes one at once.
	s = moveState([]string{"n1", "n2", "n3", "n4"}, "0:n1,n3", "1:n1,n3", "2:n1,n2", "3:n2,n3")
	got, _, err = PlanDrain(s, "n3", MoveLimits{InFlightMax: 3, IncomingMax: 1})
	want = []Move{{Partition: 0, From: "n3", To: "n4"}, {Partition: 1, From: "n3", To: "n2"}, {Partition: 3, From: "n3", To: "n1"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("incoming limit: %v, want %v (err %v)", got, want, err)
	}
	// Nothing left on n3 and nothing under way: done.
	s = moveState([]string{"n1", "n2"}, "0:n1,n2")
	if got, done, err := PlanDrain(s, "n3", oneAtATime); err != nil || !done || len(got) != 0 {
		t.Fatalf("empty node: %v done %v err %v", got, done, err)
	}
}

func TestPlanDrainRefusesWithoutRoom(t *testing.T) {
	// Two nodes, two replicas: no other node can take n2's replica.
	s := moveState([]string{"n1", "n2"}, "0:n1,n2")
	if got, _, err := PlanDrain(s, "n2", oneAtATime); !errors.Is(err, ErrMove) || len(got) != 0 {
		t.Fatalf("got %v, %v; want ErrMove and no move", got, err)
	}
	// A node that is not ready takes nothing either.
	s = moveState([]string{"n1", "n2", "n3"}, "0:n1,n2")
	s.Nodes["n3"] = NodeRecord{ID: "n3", Status: NodeNotResponding}
	if _, _, err := PlanDrain(s, "n2", oneAtATime); !errors.Is(err, ErrMove) {
		t.Fatalf("onto a node not responding: %v, want ErrMove", err)
	}
	if _, _, err := PlanDrain(s, "n2", MoveLimits{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("zero limits: %v, want ErrConfig", err)
	}
}

func TestPlanRebalance(t *testing.T) {
	// n4 is new and empty: 3,3,2,0.
	s := moveState([]string{"n1", "n2", "n3", "n4"}, "0:n1,n2", "1:n2,n3", "2:n1,n3", "3:n1,n2")
	got, done, err := PlanRebalance(s, MoveLimits{InFlightMax: 8, IncomingMax: 8})
	// n2 (3, the highest id of the most) gives its lowest partition, 0;
	// then n1 (3 to everyone's 2) its lowest that is not moving, 2.
	want := []Move{{Partition: 0, From: "n2", To: "n4"}, {Partition: 2, From: "n1", To: "n4"}}
	if err != nil || done || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v done %v err %v; want %v", got, done, err, want)
	}
	// Limits: one onto n4 at a time.
	got, _, _ = PlanRebalance(s, MoveLimits{InFlightMax: 8, IncomingMax: 1})
	if !reflect.DeepEqual(got, want[:1]) {
		t.Fatalf("incoming 1: %v", got)
	}
	// Balanced within one: done, nothing to do.
	s = moveState([]string{"n1", "n2", "n3"}, "0:n1,n2", "1:n2,n3", "2:n1,n3", "3:n1,n2")
	if got, done, err := PlanRebalance(s, oneAtATime); err != nil || !done || len(got) != 0 {
		t.Fatalf("balanced: %v done %v err %v", got, done, err)
	}
	// A dead node's replicas stay (replace's work); only running nodes count.
	s = moveState([]string{"n1", "n2"}, "0:n1,n3", "1:n2,n3")
	if got, done, _ := PlanRebalance(s, oneAtATime); !done || len(got) != 0 {
		t.Fatalf("with a dead node: %v done %v", got, done)
	}
}

func TestPlanRebalanceConverges(t *testing.T) {
	// Applying the plans, moves finishing at once, ends balanced and
	// never places two replicas of a partition on one node.
	nodes := []string{"n1", "n2", "n3", "n4", "n5"}
	var pl []string
	for p := range 40 {
		pl = append(pl, fmt.Sprintf("%d:n%d,n%d,n%d", p, 1+p%3, 1+(p+1)%3, 1+(p+2)%3))
	}
	s := moveState(nodes, pl...)
	for round := 0; ; round++ {
		if round > 200 {
			t.Fatal("no balance after 200 rounds")
		}
		got, done, err := PlanRebalance(s, MoveLimits{InFlightMax: 3, IncomingMax: 2})
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		for _, m := range got {
			for i, r := range s.Replicas[m.Partition] {
				if r.Node == m.From {
					s.Replicas[m.Partition][i].Node = m.To
				}
			}
		}
	}
	c := s.counts()
	for _, n := range nodes {
		if c[n] < 24 || c[n] > 24 {
			t.Errorf("%s holds %d, want 24 (120 replicas over 5 nodes)", n, c[n])
		}
	}
	for p, reps := range s.Replicas {
		seen := map[string]bool{}
		for _, r := range reps {
			if seen[r.Node] {
				t.Fatalf("partition %d twice on %s", p, r.Node)
			}
			seen[r.Node] = true
		}
	}
}

func TestCheckFinish(t *testing.T) {
	up := map[string]NodeRecord{"n1": {}, "n2": {}, "n3": {}, "n4": {}}
	m := Move{Partition: 0, From: "n3", To: "n4", LiveBefore: 2}
	reps := func(states ...recovery.ReplicaState) []Replica {
		var out []Replica
		for i, st := range states {
			out = append(out, Replica{Partition: 0, Node: fmt.Sprintf("n%d", []int{1, 3, 4}[i]), State: st})
		}
		return out
	}
	// The new replica rebuilding: not yet.
	if err := CheckFinish(reps(recovery.ReplicaLive, recovery.ReplicaLive, recovery.ReplicaNeedsRejoin), up, m); !errors.Is(err, ErrMoveNotReady) {
		t.Fatalf("new not live: %v", err)
	}
	// Live: n3's may go, the partition keeps two.
	if err := CheckFinish(reps(recovery.ReplicaLive, recovery.ReplicaLive, recovery.ReplicaLive), up, m); err != nil {
		t.Fatalf("new live: %v", err)
	}
	// n1 failed meanwhile: without n3 only one would be live, fewer than
	// the two before the move. The remove waits.
	if err := CheckFinish(reps(recovery.ReplicaNeedsRejoin, recovery.ReplicaLive, recovery.ReplicaLive), up, m); !errors.Is(err, ErrMoveNotReady) {
		t.Fatalf("other failed: %v", err)
	}
	// n4's node died: its live record counts for nothing.
	down := map[string]NodeRecord{"n1": {}, "n3": {}}
	if err := CheckFinish(reps(recovery.ReplicaLive, recovery.ReplicaLive, recovery.ReplicaLive), down, m); !errors.Is(err, ErrMoveNotReady) {
		t.Fatalf("new node dead: %v", err)
	}
	// The old replica was not live (drained while rebuilding): its
	// removal takes nothing live.
	m.LiveBefore = 1
	if err := CheckFinish(reps(recovery.ReplicaLive, recovery.ReplicaNeedsRejoin, recovery.ReplicaLive), up, m); err != nil {
		t.Fatalf("old not live: %v", err)
	}
}

// TestMovesInEtcd: StartMove adds the new replica and the move record and
// removes nothing; FinishMove refuses while the new replica rebuilds and
// when the placement changed since read, then removes the old replica,
// the move and the old node's task.
func TestMovesInEtcd(t *testing.T) {
	w := newWorld(t)
	cli, ctx := w.admin, w.ctx
	for _, id := range []string{"n1", "n2", "n3"} {
		w.node(id, 0)
	}
	for _, r := range []Replica{{Partition: 0, Node: "n1", State: recovery.ReplicaLive}, {Partition: 0, Node: "n2", State: recovery.ReplicaLive}} {
		if err := SetReplica(ctx, cli, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, BootstrappedKey, "1"); err != nil {
		t.Fatal(err)
	}
	old := claim.Task{Partition: 0, Dest: "n2"}
	if _, err := claim.CreateTask(ctx, cli, old, time.Now()); err != nil {
		t.Fatal(err)
	}
	v, err := ReadMoves(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	m := Move{Partition: 0, From: "n2", To: "n3"}
	if err := StartMove(ctx, cli, v, Move{Partition: 0, From: "n2", To: "n9"}, time.Now()); !errors.Is(err, ErrMove) {
		t.Fatalf("onto a node not running: %v", err)
	}
	if err := StartMove(ctx, cli, v, m, time.Now()); err != nil {
		t.Fatal(err)
	}
	// The same read again: the move record exists now.
	if err := StartMove(ctx, cli, v, m, time.Now()); !errors.Is(err, ErrMoveNotReady) {
		t.Fatalf("start twice from one read: %v", err)
	}
	v, err = ReadMoves(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Moves[0]; got.From != "n2" || got.To != "n3" || got.LiveBefore != 2 || len(v.Replicas[0]) != 3 {
		t.Fatalf("after start: move %+v, replicas %v", got, v.Replicas[0])
	}
	if err := FinishMove(ctx, cli, v, m); !errors.Is(err, ErrMoveNotReady) {
		t.Fatalf("finish while rebuilding: %v", err)
	}
	if err := UpdateReplica(ctx, cli, Replica{Partition: 0, Node: "n3", State: recovery.ReplicaLive}); err != nil {
		t.Fatal(err)
	}
	// A read from before n3 went live is refused by etcd, not only by
	// CheckFinish: fake it live in the old read.
	stale := *v
	stale.Replicas = map[uint32][]Replica{0: {{Partition: 0, Node: "n1", State: recovery.ReplicaLive}, {Partition: 0, Node: "n2", State: recovery.ReplicaLive}, {Partition: 0, Node: "n3", State: recovery.ReplicaLive}}}
	if err := FinishMove(ctx, cli, &stale, m); !errors.Is(err, ErrMoveNotReady) {
		t.Fatalf("finish from a stale read: %v", err)
	}
	if v, err = ReadMoves(ctx, cli); err != nil {
		t.Fatal(err)
	}
	if err := FinishMove(ctx, cli, v, m); err != nil {
		t.Fatal(err)
	}
	if v, err = ReadMoves(ctx, cli); err != nil {
		t.Fatal(err)
	}
	if len(v.Moves) != 0 || len(v.Replicas[0]) != 2 || v.hosts(0, "n2") || !v.hosts(0, "n3") {
		t.Fatalf("after finish: moves %v, replicas %v", v.Moves, v.Replicas[0])
	}
	if _, err := claim.GetTask(ctx, cli, old); !errors.Is(err, claim.ErrNoTask) {
		t.Fatalf("n2's task after the move: %v", err)
	}
	// A move whose new replica's record went (replace moved it off a dead
	// node) is cancelled by the next pass, and the plan starts afresh.
	if err := StartMove(ctx, cli, v, Move{Partition: 0, From: "n3", To: "n2"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, ReplicaKey(0, "n2")); err != nil {
		t.Fatal(err)
	}
	evs, _, err := MovePass(ctx, cli, func(MoveState) ([]Move, bool, error) { return nil, false, nil }, time.Now())
	if err != nil || len(evs) != 1 || !evs[0].Cancelled {
		t.Fatalf("pass over a move whose new replica is gone: %+v, %v", evs, err)
	}
	if moves, err := ListMoves(ctx, cli); err != nil || len(moves) != 0 {
		t.Fatalf("after cancel: %v, %v", moves, err)
	}
	// A move undone by hand while its new replica rebuilds: the new
	// replica, the move and the task onto it go; the old replica stays.
	m = Move{Partition: 0, From: "n3", To: "n2"}
	if v, err = ReadMoves(ctx, cli); err != nil {
		t.Fatal(err)
	}
	if _, err := UndoMove(ctx, cli, v, 0); !errors.Is(err, ErrMove) {
		t.Fatalf("undo with no move under way: %v", err)
	}
	if err := StartMove(ctx, cli, v, m, time.Now()); err != nil {
		t.Fatal(err)
	}
	onto := claim.Task{Partition: 0, Dest: "n2"}
	if _, err := claim.CreateTask(ctx, cli, onto, time.Now()); err != nil {
		t.Fatal(err)
	}
	if v, err = ReadMoves(ctx, cli); err != nil {
		t.Fatal(err)
	}
	if err := UpdateReplica(ctx, cli, Replica{Partition: 0, Node: "n2", State: recovery.ReplicaNeedsRejoin}); err != nil {
		t.Fatal(err)
	}
	if _, err := UndoMove(ctx, cli, v, 0); !errors.Is(err, ErrMoveNotReady) {
		t.Fatalf("undo from a read older than the new replica's record: %v", err)
	}
	if v, err = ReadMoves(ctx, cli); err != nil {
		t.Fatal(err)
	}
	if got, err := UndoMove(ctx, cli, v, 0); err != nil || got.To != "n2" {
		t.Fatalf("undo: %+v, %v", got, err)
	}
	if v, err = ReadMoves(ctx, cli); err != nil {
		t.Fatal(err)
	}
	if len(v.Moves) != 0 || v.hosts(0, "n2") || !v.hosts(0, "n3") || !v.hosts(0, "n1") {
		t.Fatalf("after undo: moves %v, replicas %v", v.Moves, v.Replicas[0])
	}
	if _, err := claim.GetTask(ctx, cli, onto); !errors.Is(err, claim.ErrNoTask) {
		t.Fatalf("the task onto n2 after undo: %v", err)
	}
	// A new replica live already is not taken back.
	if err := StartMove(ctx, cli, v, m, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := UpdateReplica(ctx, cli, Replica{Partition: 0, Node: "n2", State: recovery.ReplicaLive}); err != nil {
		t.Fatal(err)
	}
	if v, err = ReadMoves(ctx, cli); err != nil {
		t.Fatal(err)
	}
	if _, err := UndoMove(ctx, cli, v, 0); !errors.Is(err, ErrMove) || !strings.Contains(err.Error(), "live already") {
		t.Fatalf("undo of a move whose new replica is live: %v", err)
	}
	if err := FinishMove(ctx, cli, v, m); err != nil {
		t.Fatal(err)
	}
	// A removed replica is not recreated by its old node's late publish.
	if err := UpdateReplica(ctx, cli, Replica{Partition: 0, Node: "n3", State: recovery.ReplicaLive}); !errors.Is(err, ErrNotPlaced) {
		t.Fatalf("late publish: %v", err)
	}
	// Nor does it land on a record placed on its node again since: that
	// is another replica's, to be rebuilt.
	var was int64
	for _, r := range v.Replicas[0] {
		if r.Node == "n3" {
			was = r.Created
		}
	}
	if err := SetReplicas(ctx, cli, []Replica{{Partition: 0, Node: "n3", State: recovery.ReplicaNeedsRejoin}}); err != nil {
		t.Fatal(err)
	}
	if err := UpdateReplica(ctx, cli, Replica{Partition: 0, Node: "n3", State: recovery.ReplicaLive, Created: was}); was == 0 || !errors.Is(err, ErrNotPlaced) {
		t.Fatalf("late publish of the record of %d onto the one placed again: %v", was, err)
	}
	reps, err := Replicas(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reps {
		if r.Partition == 0 && r.Node == "n3" {
			if r.State != recovery.ReplicaNeedsRejoin {
				t.Fatalf("the record placed again says %s", r.State)
			}
			if err := UpdateReplica(ctx, cli, Replica{Partition: 0, Node: "n3", State: recovery.ReplicaLive, Created: r.Created}); err != nil {
				t.Fatalf("publish onto the replica's own record: %v", err)
			}
		}
	}
}
