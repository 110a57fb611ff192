package supervise

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// TestIncarnate: the first start of a node is incarnation 1, each later
// one counts on, and starts that race still get distinct counts: exactly
// one of them is the first.
func TestIncarnate(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	first, err := Incarnate(ctx, cli, "n1", nil, now)
	if err != nil {
		t.Fatal(err)
	}
	if !first.First() || first.Count != 1 || first.Node != "n1" || !first.Started.Equal(now) {
		t.Fatalf("first start: %+v", first)
	}
	again, err := Incarnate(ctx, cli, "n1", nil, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if again.First() || again.Count != 2 {
		t.Fatalf("second start: %+v", again)
	}

	const racers = 4
	var wg sync.WaitGroup
	counts := make([]uint64, racers)
	errs := make([]error, racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inc, err := Incarnate(ctx, cli, "n2", nil, now)
			counts[i], errs[i] = inc.Count, err
		}()
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for i, c := range counts {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if seen[c] || c < 1 || c > racers {
			t.Fatalf("racing starts got counts %v", counts)
		}
		seen[c] = true
	}

	if _, err := Incarnate(ctx, cli, "n/3", nil, now); !errors.Is(err, ErrBadName) {
		t.Fatalf("node id with '/': %v", err)
	}
	if _, err := cli.Put(ctx, IncarnationKey("n4"), `{"count":0}`); err != nil {
		t.Fatal(err)
	}
	if _, err := Incarnate(ctx, cli, "n4", nil, now); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt record: %v", err)
	}
}

// TestBootstrapped: a start is told whether every node of the placement
// had started before it; only then may the cluster have taken writes, and
// only then must a starting node's replicas rejoin. Restarts before that
// (nothing written yet) still come up as before bootstrap.
func TestBootstrapped(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	placed := []string{"n1", "n2"}
	step := func(node string, wantCount uint64, wantBootstrapped bool) {
		t.Helper()
		st, err := Incarnate(ctx, cli, node, placed, now)
		if err != nil {
			t.Fatal(err)
		}
		if st.Count != wantCount || st.Bootstrapped != wantBootstrapped {
			t.Fatalf("%s: count %d bootstrapped %v; want %d %v", node, st.Count, st.Bootstrapped, wantCount, wantBootstrapped)
		}
	}
	check := func(want bool) {
		t.Helper()
		got, err := Bootstrapped(ctx, cli, placed)
		if err != nil || got != want {
			t.Fatalf("Bootstrapped = %v, %v; want %v", got, err, want)
		}
	}
	mark := func(node string) {
		t.Helper()
		if err := MarkRegistered(ctx, cli, node); err != nil {
			t.Fatal(err)
		}
	}
	check(false)
	step("n1", 1, false)
	mark("n1")
	step("n1", 2, false) // n2 never started: nothing was written yet
	check(false)
	step("n2", 1, false)
	// Started but not registered: no other node sees n2 alive yet, and a
	// write taken now would miss its replicas, which start live.
	check(false)
	mark("n2") // its registration completes the bootstrap
	check(true)
	step("n1", 3, true)
	step("n2", 2, true)
	check(true) // a later start keeps the mark
	if err := MarkRegistered(ctx, cli, "n3"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("marking a node that never started: %v, want ErrCorrupt", err)
	}
	if ok, err := Bootstrapped(ctx, cli, append(placed, "n3")); err != nil || ok {
		t.Fatalf("a node that never started: bootstrapped %v, %v", ok, err)
	}
}

// TestClaimHolder: a claim taken with ExecutorID names its node and
// epoch; one taken without a node part names no node.
func TestClaimHolder(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	task := claim.Task{Partition: 3, Dest: "n2"}
	if _, found, err := ClaimHolder(ctx, cli, task); err != nil || found {
		t.Fatalf("no claim: found %v, %v", found, err)
	}
	c, err := claim.Acquire(ctx, cli, task, ExecutorID("n1"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h, found, err := ClaimHolder(ctx, cli, task)
	if err != nil || !found {
		t.Fatalf("claim held: found %v, %v", found, err)
	}
	if h.Node != "n1" || h.Epoch != c.Epoch() || h.Task != task || h.Executor != c.Attempt().Executor {
		t.Fatalf("holder %+v, claim epoch %d executor %s", h, c.Epoch(), c.Attempt().Executor)
	}
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c, err = claim.Acquire(ctx, cli, task, claim.NewExecutorID(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Release(ctx) }()
	if h, found, err := ClaimHolder(ctx, cli, task); err != nil || !found || h.Node != "" || h.Epoch != c.Epoch() {
		t.Fatalf("claim without a node: %+v, found %v, %v", h, found, err)
	}
}
