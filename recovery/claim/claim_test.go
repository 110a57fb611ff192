package claim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/stream/faultnet"
)

var raceSeed = flag.Uint64("claim.seed", 0, "seed of TestClaimRace (0: from the clock)")

// lossSlack is what a test allows past the one-window promise for the
// machine itself: goroutine scheduling and an fsync-less local etcd round
// trip on two shared cores under -race. Measured values are logged.
const lossSlack = 300 * time.Millisecond

// TestClaimRace races 2 to 8 executors, each with its own client, for one
// task over 1000 rounds: exactly one wins each round, the others are told
// who holds it, and the winners' epochs strictly grow.
func TestClaimRace(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	const executorsMax, rounds = 8, 1000
	seed := *raceSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d; replay: go test -race -run 'TestClaimRace$' ./recovery/claim/ -claim.seed=%d", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	// A bound against a hang, not a speed check: under -race, beside the
	// other packages' tests (node processes included), 1000 rounds have
	// taken over 45 s on the two-core machine.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	task := Task{Partition: 42, Dest: "node-1"}
	type result struct {
		exec int
		c    *Claim
		err  error
	}
	results := make(chan result, executorsMax)
	starts := make([]chan struct{}, executorsMax)
	ids := make([]string, executorsMax)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range executorsMax {
		cli := newClient(t, e)
		starts[i], ids[i] = make(chan struct{}, 1), NewExecutorID()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range starts[i] {
				c, err := Acquire(ctx, cli, task, ids[i], 10*time.Second)
				results <- result{exec: i, c: c, err: err}
			}
		}()
	}
	defer func() {
		for _, s := range starts {
			close(s)
		}
	}()

	var lastEpoch uint64
	var raced, racedRounds int // losers of the transaction itself, and rounds with one
	began := time.Now()
	for round := range rounds {
		n := 2 + rng.IntN(executorsMax-1)
		for _, i := range rng.Perm(executorsMax)[:n] {
			starts[i] <- struct{}{}
		}
		var winner *Claim
		var lost []result
		racedBefore := raced
		for range n {
			var r result
			select {
			case r = <-results:
			case <-ctx.Done():
				t.Fatalf("round %d: %v", round, ctx.Err())
			}
			switch {
			case r.err == nil && winner != nil:
				t.Fatalf("round %d: executors %s and %s both hold the claim", round, winner.Attempt().Executor, ids[r.exec])
			case r.err == nil:
				winner = r.c
			case errors.Is(r.err, ErrClaimed):
				lost = append(lost, r)
			default:
				t.Fatalf("round %d: executor %d: %v", round, r.exec, r.err)
			}
		}
		if winner == nil {
			t.Fatalf("round %d: nobody won among %d", round, n)
		}
		for _, r := range lost {
			// The losers ran after the winner's put and before its release.
			var ce *ClaimedError
			if !errors.As(r.err, &ce) || ce.Holder != winner.Attempt().Executor || ce.Epoch != winner.Epoch() {
				t.Fatalf("round %d: loser %d told %v, winner is %s at %d", round, r.exec, r.err, winner.Attempt().Executor, winner.Epoch())
			}
			if ce.raced {
				raced++
			}
		}
		if raced > racedBefore {
			racedRounds++
		}
		if winner.Epoch() <= lastEpoch {
			t.Fatalf("round %d: epoch %d after %d", round, winner.Epoch(), lastEpoch)
		}
		lastEpoch = winner.Epoch()
		if err := winner.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(winner.Err(), ErrReleased) {
			t.Fatalf("round %d: released claim says %v", round, winner.Err())
		}
	}
	t.Logf("%d rounds in %s, last epoch %d; in %d rounds, %d losers lost the create-if-absent transaction itself (the others saw the claim at their first read)",
		rounds, time.Since(began).Round(time.Millisecond), lastEpoch, racedRounds, raced)
	if raced == 0 {
		t.Error("no executor ever lost in the transaction: the race was never run")
	}
}

// TestEpochIsCreateRevision checks what the fencing rests on: the epoch
// is the claim key's CreateRevision, and a claim names its holder.
func TestEpochIsCreateRevision(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	task := Task{Partition: 7, Dest: "n2"}
	c, err := Acquire(ctx, cli, task, "host:1:a", 5*time.Second, WithWindow(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release(ctx)
	resp, err := cli.Get(ctx, task.ClaimKey())
	if err != nil {
		t.Fatal(err)
	}
	if kv := resp.Kvs[0]; uint64(kv.CreateRevision) != c.Epoch() || string(kv.Value) != "host:1:a" || clientv3.LeaseID(kv.Lease) != c.lease {
		t.Fatalf("key %+v, claim epoch %d lease %x", kv, c.Epoch(), c.lease)
	}
	if _, err := Acquire(ctx, cli, task, "host:1:a", 5*time.Second); !errors.Is(err, ErrClaimed) {
		t.Fatalf("second claim by the same executor: %v", err)
	}
	for _, bad := range []struct {
		ttl, window time.Duration
	}{{0, 0}, {2 * time.Second, 2 * time.Second}, {2 * time.Second, time.Millisecond}, {2 * TTLMax, time.Second}} {
		if _, err := Acquire(ctx, cli, Task{Partition: 8, Dest: "n2"}, "x", bad.ttl, WithWindow(bad.window)); !errors.Is(err, ErrConfig) {
			t.Errorf("ttl %s window %s: %v", bad.ttl, bad.window, err)
		}
	}
	if _, err := Acquire(ctx, cli, Task{Partition: 8, Dest: "a/b"}, "x", time.Second); !errors.Is(err, ErrBadName) {
		t.Errorf("dest with a slash: %v", err)
	}
}

// takeoverTiming is what the takeover tests measure, from the moment the
// first executor stops being able to refresh its claim.
type takeoverTiming struct {
	keyGone  time.Duration // etcd deleted the key (lease expired); 0 if not watched
	oldLost  time.Duration // the old executor's Lost closed
	newClaim time.Duration // the new executor's Acquire succeeded
}

func (tt takeoverTiming) String() string {
	s := fmt.Sprintf("old executor lost +%s, new claim +%s", tt.oldLost.Round(time.Millisecond), tt.newClaim.Round(time.Millisecond))
	if tt.keyGone != 0 {
		s = fmt.Sprintf("key gone +%s, %s", tt.keyGone.Round(time.Millisecond), s)
	}
	return s
}

// acquireWithin retries Acquire every pollEvery until it succeeds or the
// deadline passes, and fails the test then.
func acquireWithin(t *testing.T, ctx context.Context, cli *clientv3.Client, task Task, id string, ttl time.Duration, deadline time.Time, opts ...Option) *Claim {
	t.Helper()
	const pollEvery = 20 * time.Millisecond
	for time.Now().Before(deadline) {
		c, err := Acquire(ctx, cli, task, id, ttl, opts...)
		if err == nil {
			return c
		}
		if !errors.Is(err, ErrClaimed) {
			t.Fatalf("claim %s: %v", task, err)
		}
		time.Sleep(pollEvery)
	}
	t.Fatalf("could not claim %s before %s", task, deadline.Format(time.RFC3339Nano))
	return nil
}

// TestPausedExecutor plays an executor paused past its TTL: its keepalive
// stops, the lease expires, a second executor claims with a higher epoch,
// and the first learns within one window of the loss that it lost; it can
// no longer write the task, and its Release leaves the second's claim.
func TestPausedExecutor(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cliA, cliB, cliW := newClient(t, e), newClient(t, e), newClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const ttl, window = 2 * time.Second, 500 * time.Millisecond
	task := Task{Partition: 3, Dest: "n7"}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := CreateTask(ctx, cliA, task, now); err != nil {
		t.Fatal(err)
	}
	a, err := Acquire(ctx, cliA, task, "host-a:1:aa", ttl, WithWindow(window))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := StartTask(ctx, cliA, a.Attempt(), now); err != nil {
		t.Fatal(err)
	}

	// Watch the key to time its deletion by the lease's expiry.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	deleted := make(chan time.Time, 1)
	wch := cliW.Watch(wctx, task.ClaimKey(), clientv3.WithRev(int64(a.Epoch())+1))
	var wwg sync.WaitGroup
	wwg.Add(1)
	go func() {
		defer wwg.Done()
		for resp := range wch { // ends when wctx is canceled
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					select {
					case deleted <- time.Now():
					default:
					}
				}
			}
		}
	}()
	defer wwg.Wait()
	defer wcancel()

	// The lease guard: held now, and never promised as far as a TTL ahead.
	if now := time.Now(); !a.Held(now) || a.Held(now.Add(ttl)) {
		t.Fatalf("lease guard: Held(now) %v, Held(now+ttl) %v; want true, false", a.Held(now), a.Held(now.Add(ttl)))
	}
	paused := time.Now()
	a.StopKeepAlive()
	b := acquireWithin(t, ctx, cliB, task, "host-b:2:bb", ttl, paused.Add(3*ttl), WithWindow(window))
	defer b.Release(ctx)
	claimedB := time.Now()
	var gone time.Time
	select {
	case gone = <-deleted:
	case <-time.After(time.Second):
		t.Fatal("no delete event for the expired claim")
	}
	select {
	case <-a.Lost():
	case <-time.After(window + lossSlack):
		t.Fatalf("old executor not told within a window of losing (key gone %s ago)", time.Since(gone))
	}
	lostA := time.Now()
	// A woken executor that asks the guard before acting never acts on
	// the claim once its key can be gone or someone else holds it.
	if a.Held(gone) || a.Held(claimedB) {
		t.Errorf("lease guard still held when the key expired (%v) or the new claim was made (%v)", a.Held(gone), a.Held(claimedB))
	}
	timing := takeoverTiming{keyGone: gone.Sub(paused), oldLost: lostA.Sub(paused), newClaim: claimedB.Sub(paused)}
	t.Logf("ttl %s, window %s, from keepalive stop: %s; loss seen %s after the key went",
		ttl, window, timing, lostA.Sub(gone).Round(time.Millisecond))
	if lostA.Sub(gone) > window+lossSlack {
		t.Errorf("loss seen %s after the key went, window %s", lostA.Sub(gone), window)
	}
	if !errors.Is(a.Err(), ErrLost) || !(errors.Is(a.Err(), ErrClaimGone) || errors.Is(a.Err(), ErrSuperseded)) {
		t.Errorf("old executor lost for %v", a.Err())
	}
	if b.Epoch() <= a.Epoch() {
		t.Fatalf("new epoch %d not above old %d", b.Epoch(), a.Epoch())
	}

	// Harmless when it wakes: no write in the task's name, no effect on
	// the new claim.
	if _, err := Touch(ctx, cliA, a.Attempt(), now.Add(time.Second)); !errors.Is(err, ErrNotHolder) {
		t.Errorf("old executor touched the task: %v", err)
	}
	rec, err := StartTask(ctx, cliB, b.Attempt(), now.Add(2*time.Second))
	if err != nil || rec.Attempts != 2 || rec.Epoch != b.Epoch() {
		t.Fatalf("takeover start: %+v %v", rec, err)
	}
	if _, err := StartTask(ctx, cliA, a.Attempt(), now.Add(3*time.Second)); !errors.Is(err, ErrStaleEpoch) && !errors.Is(err, ErrNotHolder) {
		t.Errorf("old executor restarted the task: %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	assertHeld(t, ctx, cliW, b)
}

// assertHeld checks that c's key is in etcd and c has not seen a loss for
// a window and a half.
func assertHeld(t *testing.T, ctx context.Context, cli *clientv3.Client, c *Claim) {
	t.Helper()
	resp, err := cli.Get(ctx, c.Task().ClaimKey())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || uint64(resp.Kvs[0].CreateRevision) != c.Epoch() {
		t.Fatalf("claim of epoch %d gone: %v", c.Epoch(), resp.Kvs)
	}
	select {
	case <-c.Lost():
		t.Fatalf("claim of epoch %d lost: %v", c.Epoch(), c.Err())
	case <-time.After(c.Window() * 3 / 2):
	}
}

// TestPartitionedExecutor cuts one executor off from etcd through a
// loopback proxy that swallows every byte. It gives its claim up within a
// window, before its lease can expire; a second executor claims after the
// expiry with a higher epoch; once the proxy lets traffic through again,
// the first one's Release leaves the second's claim alone.
func TestPartitionedExecutor(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	px, err := faultnet.Start(e.Endpoints()[0][len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	cliA, cliB := newClient(t, e, px.Endpoint()), newClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const ttl, window = 2 * time.Second, 500 * time.Millisecond
	task := Task{Partition: 9, Dest: "n1"}
	a, err := Acquire(ctx, cliA, task, "host-a:1:aa", ttl, WithWindow(window))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(window) // a few checks and a keepalive through the proxy

	cut := time.Now()
	px.Freeze()
	select {
	case <-a.Lost():
	case <-time.After(window + lossSlack):
		t.Fatal("cut-off executor not told within a window")
	}
	lostA := time.Now()
	if !errors.Is(a.Err(), ErrUnreachable) {
		t.Errorf("cut-off executor lost for %v", a.Err())
	}
	b := acquireWithin(t, ctx, cliB, task, "host-b:2:bb", ttl, cut.Add(3*ttl), WithWindow(window))
	defer b.Release(ctx)
	claimedB := time.Now()
	timing := takeoverTiming{oldLost: lostA.Sub(cut), newClaim: claimedB.Sub(cut)}
	t.Logf("ttl %s, window %s, from the cut: %s", ttl, window, timing)
	if !lostA.Before(claimedB) {
		t.Errorf("old executor stopped at +%s, after the new claim at +%s", timing.oldLost, timing.newClaim)
	}
	if b.Epoch() <= a.Epoch() {
		t.Fatalf("new epoch %d not above old %d", b.Epoch(), a.Epoch())
	}

	px.Thaw()
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	assertHeld(t, ctx, cliB, b)
}

// TestEtcdUnreachable stops the server under three claims: each learns
// within its window. After a restart on the same data, a released task is
// claimed at once and an abandoned one after its lease runs out, both with
// epochs above every earlier one.
func TestEtcdUnreachable(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	const ttl = 2 * time.Second
	windows := []time.Duration{400 * time.Millisecond, 500 * time.Millisecond, time.Second}
	var claims []*Claim
	var maxEpoch uint64
	for i, w := range windows {
		cli := newClient(t, e)
		c, err := Acquire(ctx, cli, Task{Partition: uint32(i), Dest: "n1"}, fmt.Sprintf("host:%d:old", i), ttl, WithWindow(w))
		if err != nil {
			t.Fatal(err)
		}
		claims = append(claims, c)
		maxEpoch = max(maxEpoch, c.Epoch())
	}
	time.Sleep(500 * time.Millisecond)

	stopped := make(chan struct{})
	down := time.Now()
	go func() {
		defer close(stopped)
		e.Stop()
	}()
	for i, c := range claims {
		select {
		case <-c.Lost():
		case <-time.After(time.Until(down.Add(c.Window() + lossSlack))):
			t.Fatalf("claim %d (window %s) not lost %s after etcd went down", i, c.Window(), time.Since(down))
		}
		t.Logf("claim %d, window %s: lost +%s: %v", i, c.Window(), time.Since(down).Round(time.Millisecond), c.Err())
		if !errors.Is(c.Err(), ErrLost) {
			t.Errorf("claim %d: %v", i, c.Err())
		}
	}
	<-stopped
	t.Logf("stop took %s", time.Since(down).Round(time.Millisecond))

	restart := time.Now()
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart took %s", time.Since(restart).Round(time.Millisecond))

	// Task 0: its old executor releases its lost claim (still its key, the
	// lease outlived the outage), so the task is free at once.
	if err := claims[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	cli := newClient(t, e)
	n0, err := Acquire(ctx, cli, claims[0].Task(), "host:0:new", ttl)
	if err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	defer n0.Release(ctx)
	// Task 1: abandoned; free when its lease expires (etcd restarts lease
	// clocks on recovery, so a TTL after the restart at most).
	begin := time.Now()
	n1 := acquireWithin(t, ctx, cli, claims[1].Task(), "host:1:new", ttl, begin.Add(3*ttl))
	defer n1.Release(ctx)
	t.Logf("abandoned task claimed again %s after the restart", time.Since(restart).Round(time.Millisecond))
	for _, n := range []*Claim{n0, n1} {
		if n.Epoch() <= maxEpoch {
			t.Errorf("epoch %d after restart, %d before", n.Epoch(), maxEpoch)
		}
	}
	// The old executors' releases leave the new claims alone.
	for _, c := range claims {
		if err := c.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	assertHeld(t, ctx, cli, n0)
	assertHeld(t, ctx, cli, n1)
}
