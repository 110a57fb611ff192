package supervise

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
)

// TestSnapshotReadsTaskPartitions: a pass's snapshot holds the replica
// records of the partitions with an open task only, while they are few,
// and the whole placement past snapshotPartitionsMax of them; the
// snapshot others read (rejoin status) holds it always.
func TestSnapshotReadsTaskPartitions(t *testing.T) {
	checkLeaks(t)
	cli := newClient(t, startEtcd(t))
	ctx := testCtx(t, 30*time.Second)
	const parts = 200
	var rs []Replica
	for p := range uint32(parts) {
		rs = append(rs, Replica{Partition: p, Node: "n1", State: recovery.ReplicaLive}, Replica{Partition: p, Node: "n2", State: recovery.ReplicaNeedsRejoin})
	}
	if err := SetReplicas(ctx, cli, rs); err != nil {
		t.Fatal(err)
	}
	s, err := readPassSnapshot(ctx, cli)
	if err != nil || len(s.Replicas) != 0 {
		t.Fatalf("no task: replicas of %d partitions, %v", len(s.Replicas), err)
	}
	if s, err := ReadSnapshot(ctx, cli); err != nil || len(s.Replicas) != parts {
		t.Fatalf("ReadSnapshot: replicas of %d partitions, %v", len(s.Replicas), err)
	}
	for _, p := range []uint32{5, 150} {
		if _, err := claim.CreateTask(ctx, cli, claim.Task{Partition: p, Dest: "n2"}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	s, err = readPassSnapshot(ctx, cli)
	if err != nil || len(s.Replicas) != 2 || len(s.Replicas[5]) != 2 || len(s.Replicas[150]) != 2 || withoutCreated(s.Replicas[150][0]) != rs[300] {
		t.Fatalf("tasks of 5 and 150: replicas %v, %v", s.Replicas, err)
	}
	for p := range uint32(snapshotPartitionsMax) {
		if _, err := claim.CreateTask(ctx, cli, claim.Task{Partition: p, Dest: "n2"}, time.Now()); err != nil && p != 5 {
			t.Fatal(err)
		}
	}
	s, err = readPassSnapshot(ctx, cli)
	if err != nil || len(s.Replicas) != parts {
		t.Fatalf("tasks of %d partitions: replicas of %d partitions, %v", snapshotPartitionsMax+1, len(s.Replicas), err)
	}
}

// TestMembershipApply: a listed membership kept by a watch's events
// equals a list made after them; an event at or below the listed
// revision changes nothing.
func TestMembershipApply(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 30*time.Second)
	if err := SetReplicas(ctx, cli, []Replica{{Partition: 1, Node: "n1", State: recovery.ReplicaLive}, {Partition: 1, Node: "n2", State: recovery.ReplicaLive}}); err != nil {
		t.Fatal(err)
	}
	n1, err := Register(ctx, cli, "n1", NodeOptions{Address: "a:1", Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	m, err := ListMembership(ctx, cli)
	if err != nil || len(m.Nodes) != 1 || len(m.Replicas) != 2 {
		t.Fatalf("listed %+v, %v", m, err)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := WatchMembership(wctx, cli, m.Rev)
	if err := SetReplica(ctx, cli, Replica{Partition: 1, Node: "n2", State: recovery.ReplicaNeedsRejoin}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, ReplicaKey(1, "n1")); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, assignPrefix+"x", "not a membership record"); err != nil {
		t.Fatal(err)
	}
	if err := n1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want, err := ListMembership(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	var nodes, reps bool
	timeout := time.After(10 * time.Second)
	for len(m.Nodes) != 0 || len(m.Replicas) != 1 || m.Replicas[ReplicaKey(1, "n2")].State != recovery.ReplicaNeedsRejoin {
		var resp clientv3.WatchResponse
		select {
		case resp = <-wch:
		case <-timeout:
			t.Fatalf("the watch's events kept %+v; listed %+v", m, want)
		}
		if err := resp.Err(); err != nil {
			t.Fatal(err)
		}
		for _, ev := range resp.Events {
			n, r, err := m.Apply(ev)
			if err != nil {
				t.Fatal(err)
			}
			nodes, reps = nodes || n, reps || r
			if n2, r2, err := m.Apply(ev); n2 || r2 || err != nil {
				t.Fatalf("an event applied twice changed %v %v (%v)", n2, r2, err)
			}
		}
	}
	if !nodes || !reps || len(m.Nodes) != 0 || len(m.Replicas) != 1 || m.Replicas[ReplicaKey(1, "n2")] != want.Replicas[ReplicaKey(1, "n2")] {
		t.Fatalf("kept %+v (changed nodes %v, replicas %v), listed %+v", m, nodes, reps, want)
	}
	bad := &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(ReplicaKey(2, "n1")), Value: []byte("{"), ModRevision: m.Rev + 10}}
	if _, _, err := m.Apply(bad); err == nil || len(m.Replicas) != 1 {
		t.Fatalf("a corrupt record applied: %v, %d replicas", err, len(m.Replicas))
	}
}

// TestMembershipApplyOneTxn: the records one etcd transaction writes
// share its revision, and a watch brings them as events of one revision;
// every one of them is applied. A node that came back wrote its two
// replicas needs-rejoin in one transaction, the view kept the second live,
// and every initiator waited for a replica that was rebuilding: the demo's
// writes stopped for the whole rejoin.
func TestMembershipApplyOneTxn(t *testing.T) {
	checkLeaks(t)
	cli := newClient(t, startEtcd(t))
	ctx := testCtx(t, 30*time.Second)
	live := []Replica{{Partition: 1, Node: "n3", State: recovery.ReplicaLive}, {Partition: 2, Node: "n3", State: recovery.ReplicaLive}}
	if err := SetReplicas(ctx, cli, live); err != nil {
		t.Fatal(err)
	}
	m, err := ListMembership(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := WatchMembership(wctx, cli, m.Rev)
	needs := []Replica{{Partition: 1, Node: "n3", State: recovery.ReplicaNeedsRejoin}, {Partition: 2, Node: "n3", State: recovery.ReplicaNeedsRejoin}}
	if err := SetReplicas(ctx, cli, needs); err != nil {
		t.Fatal(err)
	}
	var resp clientv3.WatchResponse
	select {
	case resp = <-wch:
	case <-time.After(10 * time.Second):
		t.Fatal("no watch response in 10 s")
	}
	if err := resp.Err(); err != nil || len(resp.Events) != 2 {
		t.Fatalf("watch response: %d events, %v", len(resp.Events), err)
	}
	for _, ev := range resp.Events {
		if _, _, err := m.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range needs {
		if got := m.Replicas[ReplicaKey(r.Partition, r.Node)]; withoutCreated(got) != r {
			t.Errorf("replica %d on %s kept as %+v after the transaction that set it %s", r.Partition, r.Node, got, r.State)
		}
	}
}
