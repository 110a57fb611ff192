package supervise

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// TestAssignmentsWatch: a node's copy of its assignments, listed then kept
// by the watch's events, follows what etcd holds: an assignment naming it
// comes in, one moved to another node or deleted goes, an event it has
// already seen changes nothing, and a record that does not decode is an
// error that changes nothing.
func TestAssignmentsWatch(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	put := func(task claim.Task, source string, seq uint32) {
		t.Helper()
		val, err := encode(Assignment{Source: source, Seq: seq, Opened: 1, Reason: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, AssignmentKey(task), val); err != nil {
			t.Fatal(err)
		}
	}
	t0, t1, t2 := claim.Task{Partition: 0, Dest: "n2"}, claim.Task{Partition: 1, Dest: "n3"}, claim.Task{Partition: 2, Dest: "n4"}
	put(t0, "n1", 1)
	put(t1, "n2", 1)
	s, err := ListAssignments(ctx, cli, "n1")
	if err != nil {
		t.Fatal(err)
	}
	want := func(what string, tasks ...claim.Task) {
		t.Helper()
		mine := s.Mine()
		if len(mine) != len(tasks) {
			t.Fatalf("%s: %d assignments %+v, want %v", what, len(mine), mine, tasks)
		}
		for i, a := range mine {
			if a.Task != tasks[i] || a.Source != "n1" {
				t.Fatalf("%s: assignment %d is %+v, want %v of n1", what, i, a, tasks[i])
			}
		}
	}
	want("listed", t0)

	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	wch := WatchAssignments(wctx, cli, s.Rev)
	next := func() []*clientv3.Event {
		t.Helper()
		select {
		case wr := <-wch:
			if err := wr.Err(); err != nil {
				t.Fatal(err)
			}
			return wr.Events
		case <-ctx.Done():
			t.Fatal("no watch event")
		}
		return nil
	}
	apply := func() {
		t.Helper()
		for _, ev := range next() {
			if err := s.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(t2, "n1", 1)
	apply()
	want("a new assignment", t0, t2)
	put(t0, "n3", 2)
	apply()
	want("t0 moved to n3", t2)
	if _, err := cli.Delete(ctx, AssignmentKey(t2)); err != nil {
		t.Fatal(err)
	}
	evs := next()
	for _, ev := range evs {
		if err := s.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	want("t2 deleted")

	// Seen already: an event at or below Rev changes nothing.
	put(t2, "n1", 2)
	late := next()
	s.Rev = late[0].Kv.ModRevision
	if err := s.Apply(late[0]); err != nil {
		t.Fatal(err)
	}
	want("an event at Rev")

	if _, err := cli.Put(ctx, AssignmentKey(t1), "{not json"); err != nil {
		t.Fatal(err)
	}
	bad := next()
	if err := s.Apply(bad[0]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a corrupt record applied: %v", err)
	}
	want("after a corrupt record")
}
