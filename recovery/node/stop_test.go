package node

import (
	"fmt"
	"os"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/wire"
)

// stopWithoutEtcdMax bounds a node's stop once etcd is gone: generous,
// for a noisy machine; a stop that waits out every etcd call's own
// timeout in turn takes longer.
const stopWithoutEtcdMax = 15 * time.Second

// TestStopWithoutEtcd: a node stopped after etcd is gone, while it serves
// a rejoin as source (holding the task's claim), and is the supervisor,
// returns within stopWithoutEtcdMax, and so does the destination.
func TestStopWithoutEtcd(t *testing.T) {
	c := newCluster(t, 2, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	rows := make([]wire.Value, 0, 2+2*500)
	for b := range 20 {
		rows = append(rows[:0], wire.String("kv"), wire.Int64(500))
		for i := range 500 {
			rows = append(rows, wire.Bytes(fmt.Appendf(nil, "key-%08d", b*500+i)), wire.Bytes(make([]byte, 100)))
		}
		if _, err := cl.call(0, partition.ProcUpsertMany, false, rows...); err != nil {
			t.Fatal(err)
		}
	}
	c.stop(2)
	fault(t, c.nodes[1].addrs, "/fault/hold?partition=0&rows=1000")
	c.start(2)
	waitUntil(t, 20*time.Second, "the source to hold mid-snapshot", func() bool {
		st := nodeStatus(t, c.nodes[1].addrs)
		return len(st.Replicas[0].Sources) == 1 && st.Replicas[0].Sources[0].Held
	})
	c.e.Stop()
	time.Sleep(time.Second) // the nodes' etcd calls in flight now wait on nobody
	for _, id := range []int{1, 2} {
		c.mu.Lock()
		rn := c.nodes[id]
		delete(c.nodes, id)
		c.mu.Unlock()
		start := time.Now()
		rn.cancel()
		select {
		case <-rn.done:
			t.Logf("n%d stopped in %s without etcd", id, time.Since(start).Round(time.Millisecond))
		case <-time.After(stopWithoutEtcdMax + 30*time.Second):
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			t.Fatalf("n%d did not stop in %s without etcd", id, stopWithoutEtcdMax+30*time.Second)
		}
		if took := time.Since(start); took > stopWithoutEtcdMax {
			t.Errorf("n%d took %s to stop without etcd, more than %s", id, took.Round(time.Millisecond), stopWithoutEtcdMax)
		}
	}
}
