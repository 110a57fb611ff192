package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream/faultnet"
	"github.com/rejoin-db/rejoin/wire"
)

// TestEtcdOutageKeepsNodes (issue 9 point 3): every node reaches etcd
// through one proxy, frozen for 3 x the node TTL while a writer goes on,
// so every node's lease expires at once, as when etcd itself is paused.
// No node exits, every replica stays live (their feeds stayed open, so
// they missed nothing), the digests match, and every acknowledged write
// reads back.
func TestEtcdOutageKeepsNodes(t *testing.T) {
	const ttl = 2 * time.Second
	var px *faultnet.Proxy
	c := newClusterWith(t, 3, 3, layout.Config{Partitions: 4, Replicas: 2, Tables: []layout.Table{layout.KV()}}, func(c *cluster) {
		var err error
		px, err = faultnet.Start(c.e.Endpoints()[0][len("http://"):])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(px.Close)
		c.etcd, c.nodeTTL = []string{px.Endpoint()}, ttl
	})
	const parts = 4
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, parts)

	var mu sync.Mutex
	var acked []int
	failed := 0
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := wire.Bytes(fmt.Appendf(nil, "key-%06d", i))
			p, err := partition.RouteValues([]wire.Value{key}, parts)
			if err == nil {
				_, err = cl.call(p, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes(fmt.Appendf(nil, "value-%d", i)))
			}
			mu.Lock()
			if err == nil {
				acked = append(acked, i)
			} else {
				failed++
			}
			mu.Unlock()
			if err != nil {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	px.Freeze()
	frozen := time.Now()
	for time.Since(frozen) < 3*ttl {
		c.mu.Lock()
		for id, rn := range c.nodes {
			select {
			case err := <-rn.done:
				c.mu.Unlock()
				t.Fatalf("node %d exited %s into the outage: %v", id, time.Since(frozen), err)
			default:
			}
		}
		c.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	px.Thaw()
	// Every node is registered again, every replica live, writes pass.
	waitUntil(t, 20*time.Second, "every node registered again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		nodes, err := supervise.Nodes(ctx, c.admin)
		return err == nil && len(nodes) == 3
	})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	thawed := count()
	waitUntil(t, 10*time.Second, "writes acknowledged again", func() bool { return count() > thawed+100 })
	close(stop)
	<-done
	reps, err := supervisorReplicas(c)
	if err != nil {
		t.Fatal(err)
	}
	for r, live := range reps {
		if !live {
			t.Errorf("replica %s not live after the outage", r)
		}
	}
	c.mu.Lock()
	for id, rn := range c.nodes {
		select {
		case err := <-rn.done:
			t.Errorf("node %d exited: %v", id, err)
		default:
		}
	}
	c.mu.Unlock()
	checkDigests(t, cl, parts, 2)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d writes acknowledged, %d refused or failed", len(acked), failed)
	for _, i := range acked {
		key := wire.Bytes(fmt.Appendf(nil, "key-%06d", i))
		p, _ := partition.RouteValues([]wire.Value{key}, parts)
		if _, err := cl.call(p, partition.ProcRead, false, wire.String("kv"), key); err != nil {
			t.Fatalf("acknowledged write %d lost: %v", i, err)
		}
	}
}
