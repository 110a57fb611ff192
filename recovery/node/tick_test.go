package node

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/wire"
)

// TestIdleReplicaNotTicked: the tick clock wakes only a replica with an
// attempt under way. A live replica and one needing a rejoin, both idle,
// get no tick; a destination attempt gets them from its start, as its
// stall and heartbeat timers need, and none after it ended. (With a
// ticker per replica, 4096 idle replicas took 409,600 wake-ups a second.)
func TestIdleReplicaNotTicked(t *testing.T) {
	n := testNode(t, t.TempDir())
	live, err := newReplica(n, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	needs := testReplica(t, n, 2)
	rj := testReplica(t, n, 3)
	for _, r := range []*replica{live, needs, rj} {
		n.goRun(r.loop)
	}
	// Events still run at once on an idle replica.
	if st, ok := ask(live, func(r *replica) recovery.ReplicaState { return r.core.State() }); !ok || st != recovery.ReplicaLive {
		t.Fatalf("live replica answered %q, %v", st, ok)
	}
	idleWindow := 30 * tickEvery
	time.Sleep(idleWindow)
	for _, r := range []*replica{live, needs, rj} {
		if got := r.ticks.Load(); got != 0 {
			t.Errorf("idle replica %d ticked %d times in %s", r.p, got, idleWindow)
		}
	}

	att, ok := ask(rj, func(r *replica) *dstAttempt {
		att, err := r.startDest("n1", 7)
		if err != nil {
			t.Errorf("startDest: %v", err)
		}
		return att
	})
	if !ok || att == nil {
		t.Fatal("no destination attempt")
	}
	waitUntil(t, 10*time.Second, "ticks for the destination attempt", func() bool { return rj.ticks.Load() >= 3 })
	// Its status is published every tick, as the timeline and the
	// membership checks read it.
	waitUntil(t, 10*time.Second, "the attempt in the published status", func() bool {
		st := rj.status.Load()
		return st.Rejoin != nil && st.Rejoin.Epoch == 7 && st.Rejoin.Ended.IsZero()
	})
	if _, ok := ask(rj, func(r *replica) bool { r.abortDest(att, wire.AbortShutdown, "test"); return true }); !ok {
		t.Fatal("abort not run")
	}
	ended := rj.ticks.Load()
	time.Sleep(idleWindow)
	if got := rj.ticks.Load(); got != ended {
		t.Errorf("replica %d ticked %d times after its attempt ended", rj.p, got-ended)
	}
	if st := rj.status.Load(); st.Rejoin == nil || st.Rejoin.Ended.IsZero() {
		t.Errorf("ended attempt not published: %+v", st.Rejoin)
	}
	for _, r := range []*replica{live, needs} {
		if got := r.ticks.Load(); got != 0 {
			t.Errorf("idle replica %d ticked %d times", r.p, got)
		}
	}
}

// TestSourceAttemptTicked: a source attempt is ticked while it runs, and
// its end is published when the ticks stop, so the timeline and the
// membership checks (attemptOpen) see it end.
func TestSourceAttemptTicked(t *testing.T) {
	cli, ctx := testEtcd(t, 30*time.Second)
	n := testNode(t, t.TempDir())
	n.cli, n.cfg.ClaimWindow = cli, 5*time.Second
	r, err := newReplica(n, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	r.addInitiator(1, 1, &beatSlot{})
	n.goRun(r.loop)

	task := claim.Task{Partition: 0, Dest: "n2"}
	c, err := claim.Acquire(ctx, cli, task, claim.NewExecutorID(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Release(context.Background()) })
	att := &srcAttempt{task: task, claim: c, epoch: c.Epoch(), started: time.Now(), link: newLink(wire.CodecNone), end: make(chan struct{})}
	if err, ok := ask(r, func(r *replica) error { return r.startSource(att) }); !ok || err != nil {
		t.Fatalf("startSource: %v, %v", err, ok)
	}
	waitUntil(t, 10*time.Second, "ticks for the source attempt", func() bool { return r.ticks.Load() >= 3 })
	waitUntil(t, 10*time.Second, "the source attempt in the published status", func() bool {
		st := r.status.Load()
		return len(st.Sources) == 1 && st.Sources[0].Epoch == att.epoch && st.Sources[0].Ended.IsZero()
	})
	if _, ok := ask(r, func(r *replica) bool {
		r.core.AbortSource(att.epoch, wire.AbortShutdown, "test")
		r.drain()
		return true
	}); !ok {
		t.Fatal("abort not run")
	}
	waitUntil(t, 10*time.Second, "the source attempt's end in the published status", func() bool {
		st := r.status.Load()
		return len(st.Sources) == 1 && st.Sources[0].Epoch == att.epoch && !st.Sources[0].Ended.IsZero()
	})
	if attemptOpen(r.status.Load()) {
		t.Error("the published status shows an attempt open")
	}
	ended := r.ticks.Load()
	time.Sleep(30 * tickEvery)
	if got := r.ticks.Load(); got != ended {
		t.Errorf("ticked %d times after the attempt ended", got-ended)
	}
}

// BenchmarkIdleReplicas: the CPU a node's idle replicas take, with no
// feed and no attempt: the replica loops alone, each second of the run
// (cpu-cores: process CPU seconds per wall second; ticks/s delivered).
// go test -run='^$' -bench=IdleReplicas -benchtime=3x ./recovery/node/
func BenchmarkIdleReplicas(b *testing.B) {
	for _, count := range []int{64, 4096} {
		b.Run(fmt.Sprintf("replicas=%d", count), func(b *testing.B) {
			n := testNode(b, b.TempDir())
			rs := make([]*replica, count)
			for i := range rs {
				r, err := newReplica(n, uint32(i), true)
				if err != nil {
					b.Fatal(err)
				}
				rs[i] = r
				n.goRun(r.loop)
			}
			time.Sleep(200 * time.Millisecond)
			var ticks0 int64
			for _, r := range rs {
				ticks0 += r.ticks.Load()
			}
			cpu0 := processCPU(b)
			b.ResetTimer()
			t0 := time.Now()
			for range b.N {
				time.Sleep(time.Second)
			}
			wall := time.Since(t0).Seconds()
			b.StopTimer()
			var ticks int64
			for _, r := range rs {
				ticks += r.ticks.Load()
			}
			b.ReportMetric((processCPU(b)-cpu0).Seconds()/wall, "cpu-cores")
			b.ReportMetric(float64(ticks-ticks0)/wall, "ticks/s")
		})
	}
}

// processCPU is the process's user and system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
