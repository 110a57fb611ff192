package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/wire"
)

// TestGracefulStopUnderLoad: a node that holds no replica (as after a
// drain) and takes client calls is stopped, as SIGTERM stops it, while
// the Go client writes through it and n1: no write comes back
// uncertain. The stopping node refuses new calls (wire.RefusedStopping:
// the client sends them to another node) and answers those in flight
// before it closes its connections. It used to close them at once, and
// the calls in flight were uncertain ('via node n4: connection broken').
func TestGracefulStopUnderLoad(t *testing.T) {
	const parts = 4
	cfg := layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}}
	c := newCluster(t, 3, cfg)
	c.start(4) // in no placement: an initiator only, like a drained node
	waitWritable(t, dialClient(t, c.nodes[1].addrs.TCP), parts)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The client tries a partition's holders first (n4 holds none), so it
	// is given n1 and n4 alone: n4 takes the calls of the partitions n1
	// holds no replica of, in turn with n1, and forwards them.
	cl, err := client.Open(ctx, c.admin, client.Options{Nodes: []string{NodeName(1), NodeName(4)}, TLS: testCreds(t, certs.ClientID("load"))})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// Until the client has n4's record, its calls go to n1..n3 only.
	waitUntil(t, 10*time.Second, "the client to call n4", func() bool {
		for i := range 20 {
			res, err := cl.Upsert(ctx, "kv", wire.Bytes(fmt.Appendf(nil, "probe-%d", i)), wire.Bytes([]byte("v")))
			if err == nil && res.Node == NodeName(4) {
				return true
			}
		}
		return false
	})

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var acked, viaN4 atomic.Int64
	var mu sync.Mutex
	var uncertain, failed []error
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := wire.Bytes(fmt.Appendf(nil, "w%02d-%06d", w, i))
				res, err := cl.Upsert(ctx, "kv", key, wire.Bytes([]byte("value")))
				switch {
				case err == nil:
					acked.Add(1)
					if res.Node == NodeName(4) {
						viaN4.Add(1)
					}
				case errors.Is(err, client.ErrUncertain):
					mu.Lock()
					uncertain = append(uncertain, err)
					mu.Unlock()
				default:
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	before := viaN4.Load()
	c.stop(4)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("writes acknowledged %d (%d via n4 before its stop); uncertain %d, failed %d", acked.Load(), before, len(uncertain), len(failed))
	if before == 0 {
		t.Fatal("no write went through n4 before its stop: the test tests nothing")
	}
	if len(uncertain) > 0 {
		t.Fatalf("%d writes uncertain across n4's graceful stop; first: %v", len(uncertain), uncertain[0])
	}
	if len(failed) > 0 {
		t.Fatalf("%d writes failed across n4's graceful stop; first: %v", len(failed), failed[0])
	}
}

// TestStopAskedThroughEtcd: a stop request for the node's process in etcd
// (rejoin drain --stop) ends its run cleanly, and the request goes with
// it; one for another process of the same id is left alone.
func TestStopAskedThroughEtcd(t *testing.T) {
	cfg := layout.Config{Partitions: 2, Replicas: 2, Tables: []layout.Table{layout.KV()}}
	c := newCluster(t, 2, cfg)
	c.start(3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes, err := supervise.Nodes(ctx, c.admin)
	if err != nil {
		t.Fatal(err)
	}
	var rec supervise.NodeRecord
	for _, n := range nodes {
		if n.ID == NodeName(3) {
			rec = n
		}
	}
	older := rec
	older.Started = rec.Started.Add(-time.Hour)
	if err := supervise.AskStop(ctx, c.admin, older); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	rn := c.nodes[3]
	c.mu.Unlock()
	select {
	case err := <-rn.done:
		t.Fatalf("n3 stopped on a request for another process of its id: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := supervise.AskStop(ctx, c.admin, rec); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-rn.done:
		if err != nil {
			t.Fatalf("n3, asked to stop: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("n3 did not stop when asked through etcd")
	}
	c.mu.Lock()
	delete(c.nodes, 3)
	c.mu.Unlock()
	resp, err := c.admin.Get(ctx, supervise.StopKey(NodeName(3)))
	if err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the stop request after the stop: %v, %v", resp.Kvs, err)
	}
}
