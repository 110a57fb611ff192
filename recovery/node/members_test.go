package node

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// TestMembershipFollowsChanges (issue 14): a node's view of a cluster of
// 4096 partitions x 3 replicas (12,288 replica records) follows a node
// registering and a replica's state changing, and an idle view reads
// next to nothing from etcd. The view used to be a list of every record
// every 100 ms: 24 pages of 512 keys ten times a second, which at this
// size timed out.
func TestMembershipFollowsChanges(t *testing.T) {
	const partitions, replicas = 4096, 3
	e, err := claim.StartEmbedded(filepath.Join(t.TempDir(), "etcd"), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	var ranges atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/etcdserverpb.KV/Range" {
			ranges.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ids := []string{"n1", "n2", "n3"}
	if err := layout.Init(ctx, cli, layout.Config{Partitions: partitions, Replicas: replicas, Tables: []layout.Table{layout.KV()}}, ids); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := supervise.Incarnate(ctx, cli, id, ids, time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := supervise.MarkRegistered(ctx, cli, id); err != nil {
			t.Fatal(err)
		}
	}
	n1, err := supervise.Register(ctx, cli, "n1", supervise.NodeOptions{Address: "127.0.0.1:1", Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n1.Close(context.Background()) }()

	nctx, stop := context.WithCancel(ctx)
	n := &Node{id: "n1", ctx: nctx, cli: cli, log: testLog(t)}
	n.members.n = n
	if err := n.members.refresh(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		n.members.run()
	}()
	defer wg.Wait()
	defer stop()

	v := n.members.view()
	if !v.bootstrapped || len(v.nodes) != 1 || len(v.placement) != partitions || len(v.placement[4095]) != replicas {
		t.Fatalf("first view: bootstrapped %v, %d nodes, %d partitions, %d replicas of 4095", v.bootstrapped, len(v.nodes), len(v.placement), len(v.placement[4095]))
	}
	live := func(v *view, p uint32, node string) bool {
		for _, rp := range v.placement[p] {
			if rp.node == node {
				return rp.live
			}
		}
		return false
	}
	if live(v, 7, "n2") {
		t.Fatal("n2's replica of 7 live while n2 is not registered")
	}

	n2, err := supervise.Register(ctx, cli, "n2", supervise.NodeOptions{Address: "127.0.0.1:2", Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n2.Close(context.Background()) }()
	waitUntil(t, 10*time.Second, "the view to see n2 registered", func() bool {
		v := n.members.view()
		return n.members.alive("n2") && live(v, 7, "n2")
	})
	if err := supervise.SetReplica(ctx, cli, supervise.Replica{Partition: 7, Node: "n2", State: recovery.ReplicaNeedsRejoin}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the view to see n2's replica of 7 need a rejoin", func() bool {
		v := n.members.view()
		return !live(v, 7, "n2") && live(v, 8, "n2")
	})
	if err := n2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the view to see n2 gone", func() bool {
		v := n.members.view()
		return !n.members.alive("n2") && !live(v, 8, "n2")
	})

	// Idle: the two nodes' activity updates come by the watch; nothing
	// is listed.
	const idle = 2 * time.Second
	before := ranges.Load()
	time.Sleep(idle)
	if got := ranges.Load() - before; got > 2 {
		t.Errorf("the view read etcd %d times in %s of idle (a list of the replicas is 24 reads)", got, idle)
	}
}
