package layout_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/wire"
)

// checkLeaks verifies, after every other cleanup of t (call it first:
// cleanups run last-in first-out), that no goroutine is left.
func checkLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// etcd starts an embedded etcd (its default limits: 128 operations per
// transaction) and returns a client of it; both stop at cleanup.
func etcd(t *testing.T) *clientv3.Client {
	t.Helper()
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var nodes3 = []string{"n1", "n2", "n3"}

// checkPlacement checks that etcd holds exactly the placement of want
// over nodes, every replica live.
func checkPlacement(t *testing.T, ctx context.Context, cli *clientv3.Client, want layout.Config, nodes []string) {
	t.Helper()
	place, err := supervise.Place(nodes, want.Partitions, want.Replicas)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := supervise.Replicas(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != int(want.Partitions)*want.Replicas {
		t.Fatalf("%d replica records, want %d x %d", len(reps), want.Partitions, want.Replicas)
	}
	got := map[uint32][]string{}
	for _, r := range reps {
		if r.State != recovery.ReplicaLive {
			t.Fatalf("replica %d on %s is %s", r.Partition, r.Node, r.State)
		}
		got[r.Partition] = append(got[r.Partition], r.Node)
	}
	for p, ns := range place {
		a, b := strings.Join(got[p], ","), strings.Join(sorted(ns), ",")
		if a != b {
			t.Fatalf("partition %d on %s, want %s", p, a, b)
		}
	}
}

func sorted(s []string) []string {
	out := append([]string{}, s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// TestInitManyPartitions: 4096 partitions of 3 replicas are 12,288
// replica records, far more than one etcd transaction may carry (128
// operations). Init writes them; the cluster reads back whole, through
// layout.Read, the placement listing a node reads at start, the
// supervisor's snapshot, and the Go client, which routes by it.
func TestInitManyPartitions(t *testing.T) {
	checkLeaks(t)
	cli := etcd(t)
	ctx := testCtx(t)
	cfg := layout.Config{Partitions: 4096, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	start := time.Now()
	if err := layout.Init(ctx, cli, cfg, nodes3); err != nil {
		t.Fatalf("init: %v", err)
	}
	t.Logf("init of %d partitions x %d replicas took %s", cfg.Partitions, cfg.Replicas, time.Since(start))
	got, err := layout.Read(ctx, cli)
	if err != nil || !reflect.DeepEqual(got, cfg) {
		t.Fatalf("read %+v, %v; want %+v", got, err, cfg)
	}
	checkPlacement(t, ctx, cli, cfg, nodes3)
	snap, err := supervise.ReadSnapshot(ctx, cli)
	if err != nil {
		t.Fatalf("supervisor snapshot: %v", err)
	}
	if len(snap.Replicas) != int(cfg.Partitions) {
		t.Fatalf("snapshot of %d partitions", len(snap.Replicas))
	}
	if _, err := cli.Get(ctx, layout.InitKey); err != nil {
		t.Fatal(err)
	} else if resp, _ := cli.Get(ctx, layout.InitKey); len(resp.Kvs) != 0 {
		t.Fatalf("%s left behind", layout.InitKey)
	}
	c, err := client.Open(ctx, cli, client.Options{})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer c.Close()
	if c.Partitions() != cfg.Partitions {
		t.Fatalf("client sees %d partitions", c.Partitions())
	}
	seen := map[uint32]bool{}
	for i := range 20000 {
		p, err := c.Route(wire.Bytes(fmt.Appendf(nil, "key-%d", i)))
		if err != nil || p >= cfg.Partitions {
			t.Fatalf("route: %d, %v", p, err)
		}
		seen[p] = true
	}
	if len(seen) < 3000 {
		t.Fatalf("20000 keys routed to only %d of 4096 partitions", len(seen))
	}
}

// TestInitTwice: a second Init on an initialised cluster is ErrExists
// and changes nothing.
func TestInitTwice(t *testing.T) {
	checkLeaks(t)
	cli := etcd(t)
	ctx := testCtx(t)
	cfg := layout.Config{Partitions: 300, Replicas: 2, Tables: []layout.Table{layout.KV()}}
	if err := layout.Init(ctx, cli, cfg, nodes3); err != nil {
		t.Fatal(err)
	}
	other := layout.Config{Partitions: 8, Replicas: 1, Tables: []layout.Table{layout.KV()}}
	if err := layout.Init(ctx, cli, other, []string{"n7"}); !errors.Is(err, layout.ErrExists) {
		t.Fatalf("second init: %v, want ErrExists", err)
	}
	if got, err := layout.Read(ctx, cli); err != nil || !reflect.DeepEqual(got, cfg) {
		t.Fatalf("after a second init: %+v, %v", got, err)
	}
	checkPlacement(t, ctx, cli, cfg, nodes3)
}

// TestInitInterrupted: what an interrupted Init leaves (its token, part of
// a placement) reads as no cluster, with a hint; Init runs again over it
// and the leftovers are gone.
func TestInitInterrupted(t *testing.T) {
	checkLeaks(t)
	cli := etcd(t)
	ctx := testCtx(t)
	if _, err := cli.Put(ctx, layout.InitKey, "an-interrupted-init"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, supervise.ReplicaKey(5, "n9"), `{"state":"live"}`); err != nil {
		t.Fatal(err)
	}
	_, err := layout.Read(ctx, cli)
	if !errors.Is(err, layout.ErrMissing) || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("read of a half-written cluster: %v", err)
	}
	cfg := layout.Config{Partitions: 100, Replicas: 2, Tables: []layout.Table{layout.KV()}}
	if err := layout.Init(ctx, cli, cfg, nodes3); err != nil {
		t.Fatal(err)
	}
	checkPlacement(t, ctx, cli, cfg, nodes3)
}

// txnHook wraps a client's KV and runs hook before the n-th transaction
// commits (counting from 1).
type txnHook struct {
	clientv3.KV
	n     int
	count int
	hook  func()
}

func (h *txnHook) Txn(ctx context.Context) clientv3.Txn {
	h.count++
	if h.count == h.n {
		h.hook()
	}
	return h.KV.Txn(ctx)
}

// hooked returns another client of cli's etcd whose n-th transaction
// runs hook first; closed at cleanup.
func hooked(t *testing.T, cli *clientv3.Client, n int, hook func()) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: cli.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.KV = &txnHook{KV: c.KV, n: n, hook: hook}
	return c
}

// TestInitRace: an Init that another Init overtakes mid-way fails and
// leaves none of its records in the other's cluster; one whose token was
// taken stops with ErrTakenOver.
func TestInitRace(t *testing.T) {
	checkLeaks(t)
	cli := etcd(t)
	ctx := testCtx(t)
	cfgA := layout.Config{Partitions: 200, Replicas: 2, Tables: []layout.Table{layout.KV()}}
	cfgB := layout.Config{Partitions: 150, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	nodesB := []string{"n4", "n5", "n6"}

	// A writes 2 of its 7 transactions of placement, B runs whole, A
	// goes on.
	a := hooked(t, cli, 4, func() {
		if err := layout.Init(ctx, cli, cfgB, nodesB); err != nil {
			t.Errorf("init B: %v", err)
		}
	})
	if err := layout.Init(ctx, a, cfgA, nodes3); !errors.Is(err, layout.ErrExists) {
		t.Fatalf("overtaken init: %v, want ErrExists", err)
	}
	if got, err := layout.Read(ctx, cli); err != nil || !reflect.DeepEqual(got, cfgB) {
		t.Fatalf("cluster %+v, %v; want B's", got, err)
	}
	checkPlacement(t, ctx, cli, cfgB, nodesB)

	// On a fresh etcd: another init takes the token mid-way.
	cli2 := etcd(t)
	c := hooked(t, cli2, 3, func() {
		if _, err := cli2.Put(ctx, layout.InitKey, "another-init"); err != nil {
			t.Error(err)
		}
	})
	if err := layout.Init(ctx, c, cfgA, nodes3); !errors.Is(err, layout.ErrTakenOver) {
		t.Fatalf("init whose token was taken: %v, want ErrTakenOver", err)
	}
	if _, err := layout.Read(ctx, cli2); !errors.Is(err, layout.ErrMissing) {
		t.Fatalf("read after a lost init: %v", err)
	}
}

// TestInitOverAnotherCluster: node records of another cluster (its
// incarnations) with no cluster record are refused, not adopted.
func TestInitOverAnotherCluster(t *testing.T) {
	checkLeaks(t)
	cli := etcd(t)
	ctx := testCtx(t)
	if _, err := supervise.Incarnate(ctx, cli, "n1", nodes3, time.Now()); err != nil {
		t.Fatal(err)
	}
	cfg := layout.Config{Partitions: 4, Replicas: 2, Tables: []layout.Table{layout.KV()}}
	if err := layout.Init(ctx, cli, cfg, nodes3); !errors.Is(err, layout.ErrStale) {
		t.Fatalf("init over another cluster's records: %v, want ErrStale", err)
	}
	if _, err := layout.Read(ctx, cli); !errors.Is(err, layout.ErrMissing) {
		t.Fatalf("read: %v", err)
	}
}

// TestInitBadConfig: a bad shape or placement writes nothing.
func TestInitBadConfig(t *testing.T) {
	checkLeaks(t)
	cli := etcd(t)
	ctx := testCtx(t)
	for name, tc := range map[string]struct {
		cfg   layout.Config
		nodes []string
	}{
		"no partitions":            {layout.Config{Partitions: 0, Replicas: 1, Tables: []layout.Table{layout.KV()}}, nodes3},
		"more replicas than nodes": {layout.Config{Partitions: 4, Replicas: 4, Tables: []layout.Table{layout.KV()}}, nodes3},
		"repeated node":            {layout.Config{Partitions: 4, Replicas: 2, Tables: []layout.Table{layout.KV()}}, []string{"n1", "n1"}},
	} {
		if err := layout.Init(ctx, cli, tc.cfg, tc.nodes); !errors.Is(err, layout.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	resp, err := cli.Get(ctx, "/rejoin/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("%d keys written by refused inits (%v)", resp.Count, err)
	}
}
