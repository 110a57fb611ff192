package supervise

import (
	"errors"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
)

// TestSetReplicas: thousands of replica records, far past etcd's 128
// operations per transaction, are written and listed back; a batch with
// one bad record writes none.
func TestSetReplicas(t *testing.T) {
	checkLeaks(t)
	cli := newClient(t, startEtcd(t))
	ctx := testCtx(t, 30*time.Second)
	var rs []Replica
	for p := range uint32(4096) {
		rs = append(rs, Replica{Partition: p, Node: "n3", State: recovery.ReplicaNeedsRejoin})
	}
	rs[100].State = recovery.ReplicaLive
	if err := SetReplicas(ctx, cli, rs); err != nil {
		t.Fatal(err)
	}
	got, err := Replicas(ctx, cli)
	if err != nil || len(got) != len(rs) {
		t.Fatalf("%d replicas back, %v", len(got), err)
	}
	for i, r := range got {
		if r.Created == 0 || r.ModRevision < r.Created || withoutCreated(r) != rs[i] {
			t.Fatalf("replica %d: %+v, want %+v with its creation's revision", i, r, rs[i])
		}
	}
	for name, bad := range map[string][]Replica{
		"state":    {{Partition: 5000, Node: "n1", State: recovery.ReplicaLive}, {Partition: 5001, Node: "n1", State: recovery.ReplicaRejoining}},
		"no state": {{Partition: 5000, Node: "n1", State: recovery.ReplicaLive}, {Partition: 5001, Node: "n1", State: 9}},
		"node":     {{Partition: 5000, Node: "n1", State: recovery.ReplicaLive}, {Partition: 5001, Node: "a/b", State: recovery.ReplicaLive}},
	} {
		if err := SetReplicas(ctx, cli, bad); err == nil {
			t.Errorf("bad %s accepted", name)
		} else if !errors.Is(err, ErrConfig) && !errors.Is(err, ErrBadName) {
			t.Errorf("bad %s: %v", name, err)
		}
	}
	if got, err := Replicas(ctx, cli); err != nil || len(got) != len(rs) {
		t.Fatalf("after refused batches: %d replicas, %v", len(got), err)
	}
}

// withoutCreated is r as written: Created and ModRevision are read from
// etcd, never set.
func withoutCreated(r Replica) Replica {
	r.Created, r.ModRevision = 0, 0
	return r
}
