package supervise

import (
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/stream/faultnet"
)

// TestSupervisorFailover: two supervisors campaign; the leader dies while
// tasks are still unassigned: a proxy between it and etcd swallows every
// byte from then on, so nothing of it reaches etcd again, not even the
// revoke a closing client would race out. The other wins once the dead
// one's session lease expires and assigns the rest from the task records
// in etcd. The takeover time is measured.
func TestSupervisorFailover(t *testing.T) {
	checkLeaks(t)
	w := newWorld(t)
	w.node("n1", 100)
	w.node("n2", 100)
	const tasks = 24
	var all []claim.Task
	for p := range uint32(tasks) {
		w.replica(p, "n1", recovery.ReplicaLive)
		w.replica(p, "n2", recovery.ReplicaLive)
		all = append(all, w.task(p, "n3"))
	}
	// Two assignments per pass, a pass per 250 ms: 3 s to assign all, so
	// the leader dies mid-work.
	cfg := fastPasses
	cfg.PassEvery = 250 * time.Millisecond
	cfg.Limits.PassActionsMax = 2
	const ttl = 2 * time.Second
	cfg.SessionTTL = ttl

	px, err := faultnet.Start(w.e.Endpoints()[0][len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	a, _, _ := w.supervisorWith("supA", cfg, newClientAt(t, px.Endpoint()))
	select {
	case <-a.Became():
	case <-time.After(5 * time.Second):
		t.Fatal("supA not elected")
	}
	b, _, _ := w.supervisor("supB", cfg)
	assigned := func() int {
		snap, err := ReadSnapshot(w.ctx, w.admin)
		if err != nil {
			t.Fatal(err)
		}
		return len(snap.Assignments)
	}
	waitFor(t, 5*time.Second, "supA to assign some", func() bool { return assigned() >= 4 })
	waitFor(t, 3*time.Second, "supB to observe supA leading", func() bool { return b.Leader() == "supA" })
	if b.Leading() {
		t.Fatal("two leaders")
	}

	killed := time.Now()
	before := assigned()
	px.Freeze()
	select {
	case <-b.Became():
	case <-time.After(ttl + 3*time.Second):
		t.Fatalf("supB not elected %s after supA died", time.Since(killed))
	}
	took := time.Since(killed)
	t.Logf("takeover: supB elected %s after supA was cut off (session TTL %s); %d of %d tasks assigned at the kill", took, ttl, before, tasks)
	if before >= tasks {
		t.Fatalf("supA assigned all %d before dying; the test did not kill it mid-work", before)
	}
	if took < ttl/2 {
		t.Fatalf("takeover after %s, before the dead leader's lease could expire", took)
	}
	waitFor(t, 8*time.Second, "supB to assign the rest", func() bool { return assigned() == tasks })
	t.Logf("all %d assigned %s after the kill", tasks, time.Since(killed))
	// Each task assigned once, by one or the other: supB carried on from
	// the records supA left, redoing nothing.
	if sa, sb := a.Stats(), b.Stats(); sa.Assigned+sb.Assigned != tasks || sb.Assigned == 0 {
		t.Fatalf("supA assigned %d, supB %d; want %d in all", sa.Assigned, sb.Assigned, tasks)
	}
	for _, task := range all {
		if a := w.assignment(task); a.Seq != 1 {
			t.Fatalf("%s assigned %d times: %+v", task, a.Seq, a)
		}
	}
	waitFor(t, 3*time.Second, "supB to observe itself", func() bool { return b.Leader() == "supB" })
}
