package node

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/bench/load"
	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/wire"
)

// BenchmarkWrite measures the write path end to end: upserts of a 16-byte
// key and a 100-byte value through the Go client into a cluster of
// in-process nodes, each write acknowledged once every live replica of its
// partition executed it. ns/op is the inverse of the throughput that
// callers concurrent callers reach; writes/s and the latency quantiles are
// reported beside it. nodes=3 is the demo's shape (4 partitions, 2
// replicas each); nodes=1 has no replication, so the two side by side
// show what the feeds and the acknowledgements cost. tls=on is mutual
// TLS on every connection, client and feeds (the default), tls=off the
// nodes' --insecure: side by side, what TLS costs.
//
//	go test -run '^$' -bench BenchmarkWrite -benchtime 20000x ./recovery/node/
func BenchmarkWrite(b *testing.B) {
	for _, shape := range []struct{ nodes, replicas int }{{1, 1}, {3, 2}} {
		for _, callers := range []int{1, 64} {
			for _, tls := range []bool{true, false} {
				b.Run(fmt.Sprintf("nodes=%d/replicas=%d/callers=%d/tls=%s", shape.nodes, shape.replicas, callers, onOff(tls)), func(b *testing.B) {
					benchWrite(b, shape.nodes, shape.replicas, callers, tls, nil)
				})
			}
		}
	}
}

// BenchmarkWriteGateway is BenchmarkWrite in the demo's shape: every
// call goes through one node, n1, as the demo's writer's do, so n1's
// initiator sequences every txn while n2's and n3's only heartbeat, and
// a replica's safe point waits for those heartbeats (docs/DESIGN.md
// "Heartbeats on demand").
//
//	go test -run '^$' -bench BenchmarkWriteGateway -benchtime 20000x ./recovery/node/
func BenchmarkWriteGateway(b *testing.B) {
	for _, callers := range []int{1, 64} {
		for _, tls := range []bool{true, false} {
			b.Run(fmt.Sprintf("nodes=3/replicas=2/callers=%d/tls=%s/gateway=n1", callers, onOff(tls)), func(b *testing.B) {
				benchWrite(b, 3, 2, callers, tls, []string{NodeName(1)})
			})
		}
	}
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// benchWrite runs the write benchmark; gateways, if not empty, are the
// nodes the client calls (client.Options.Nodes).
func benchWrite(b *testing.B, nodes, replicas, callers int, tls bool, gateways []string) {
	cfg := layout.Config{Partitions: 4, Replicas: replicas, Tables: []layout.Table{layout.KV()}}
	c := newClusterStarting(b, nodes, 0, cfg)
	opts := client.Options{Nodes: gateways}
	for id := 1; id <= nodes; id++ {
		c.startCfg(id, func(cfg *Config) {
			if !tls {
				cfg.TLS, cfg.Insecure = nil, true
			}
		})
	}
	if tls {
		opts.TLS = testCreds(b, certs.ClientID("bench"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl, err := client.Open(ctx, c.admin, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	value := make([]byte, 100)
	key := func(i int64) wire.Value { return wire.Bytes(fmt.Appendf(nil, "key-%012d", i)) }
	// The cluster takes writes once it is bootstrapped and its feeds are
	// open; the first write of each partition waits for that.
	deadline := time.Now().Add(30 * time.Second)
	for p := range int64(64) {
		for {
			_, err := cl.Upsert(ctx, "kv", key(-1-p), wire.Bytes(value))
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("cluster not writable: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	var next atomic.Int64
	hists := make([]load.Histogram, callers)
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := range callers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				if _, err := cl.Upsert(ctx, "kv", key(i), wire.Bytes(value)); err != nil {
					errs <- fmt.Errorf("write %d: %w", i, err)
					return
				}
				hists[g].Record(time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	var h load.Histogram
	for i := range hists {
		h.Merge(&hists[i])
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "writes/s")
	b.ReportMetric(float64(h.Quantile(0.5))/1e6, "p50-ms")
	b.ReportMetric(float64(h.Quantile(0.99))/1e6, "p99-ms")
}
