package supervise

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// lossSlack is what a test allows past a one-window promise for the
// machine: scheduling and a local etcd round trip on two shared cores
// under -race. Measured values are logged.
const lossSlack = 400 * time.Millisecond

func TestNodeRegisterAndClose(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	n, err := Register(ctx, cli, "n1", NodeOptions{Address: "127.0.0.1:7001", TTL: 2 * time.Second, Window: 400 * time.Millisecond, OutgoingMax: 3, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := Nodes(ctx, cli)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes %v, %v", nodes, err)
	}
	first := nodes[0]
	if first.ID != "n1" || first.Address != "127.0.0.1:7001" || first.Status != NodeReady || first.OutgoingMax != 3 || first.Lease != int64(n.Lease()) {
		t.Fatalf("record %+v", first)
	}
	// Activity updates move LastActive on, keeping the lease.
	waitFor(t, 2*time.Second, "an activity update", func() bool {
		nodes, err := Nodes(ctx, cli)
		return err == nil && len(nodes) == 1 && nodes[0].LastActive.After(first.LastActive) && nodes[0].Lease == first.Lease
	})
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(n.Err(), ErrNodeLost) {
		t.Fatalf("err after close: %v", n.Err())
	}
	if nodes, err := Nodes(ctx, cli); err != nil || len(nodes) != 0 {
		t.Fatalf("after close: %v, %v", nodes, err)
	}
}

// TestNodeUnreachable: with etcd stopped, the node's context ends within
// its window (seed 002), before its lease could expire, and the claims it
// holds are given up (their Lost closes).
func TestNodeUnreachable(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	const window = 500 * time.Millisecond
	n, err := Register(ctx, cli, "n1", NodeOptions{TTL: 2 * time.Second, Window: window, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	// A claim with a long window of its own, so that it is the node that
	// gives it up, not the claim's own checks.
	c, err := claim.Acquire(ctx, cli, task13, claim.NewExecutorID(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Hold(c); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	e.Stop()
	select {
	case <-n.Done():
	case <-time.After(window + lossSlack):
		t.Fatalf("node still registered %s after etcd stopped", time.Since(stopped))
	}
	took := time.Since(stopped)
	t.Logf("node gave up %s after etcd stopped (window %s, lease TTL 2s)", took, window)
	if !errors.Is(n.Err(), ErrUnreachable) {
		t.Fatalf("cause %v, want ErrUnreachable", n.Err())
	}
	select {
	case <-c.Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("held claim not given up")
	}
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_ = n.Close(cctx) // etcd is down: the deregistration fails, bounded

	// Once etcd is back the node registers again, as a new incarnation
	// (seed 002: it rejoins the cluster when communication is restored).
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	n2, err := Register(ctx, cli, "n1", NodeOptions{TTL: 2 * time.Second, Window: window, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNodeRecordRemoved: a node whose record is deleted (the health task
// removing it) is lost at its next activity update.
func TestNodeRecordRemoved(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	n, err := Register(ctx, cli, "n1", NodeOptions{TTL: 2 * time.Second, Window: 400 * time.Millisecond, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(ctx)
	if _, err := cli.Delete(ctx, NodeKey("n1")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.Done():
	case <-time.After(400*time.Millisecond + lossSlack):
		t.Fatal("node did not notice its record removed")
	}
	if !errors.Is(n.Err(), ErrNodeLost) || errors.Is(n.Err(), ErrUnreachable) {
		t.Fatalf("cause %v", n.Err())
	}
}
