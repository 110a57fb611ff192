package chaos

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// lanes send a workload's ops through one client per node, each ops to
// the lane with the fewest calls in flight (ties in turn). A client of
// the whole cluster goes round the nodes call after call: under a fault
// that stalls one node, every caller soon waits on it, and every
// partition looks unavailable for the fault's length. Here a stalled
// node holds the calls it has, and the others go through the rest; a
// lane whose last call failed is passed over for laneBackoff unless all
// are.
type lanes struct {
	cs []*client.Client
	// done, if set, is told the partition of each successful call.
	done *completions

	mu       sync.Mutex
	inFlight []int
	failedAt []time.Time
	next     int
}

// laneBackoff is how long a lane whose call failed is passed over.
const laneBackoff = 250 * time.Millisecond

// openLanes opens a client of each of nodes 1..n.
func openLanes(ctx context.Context, cli *clientv3.Client, tls *certs.TLS, n int, done *completions) (*lanes, error) {
	l := &lanes{done: done, inFlight: make([]int, n), failedAt: make([]time.Time, n)}
	for id := 1; id <= n; id++ {
		c, err := client.Open(ctx, cli, client.Options{TLS: tls, Nodes: []string{node.NodeName(id)}})
		if err != nil {
			l.close()
			return nil, err
		}
		l.cs = append(l.cs, c)
	}
	return l, nil
}

func (l *lanes) close() {
	for _, c := range l.cs {
		c.Close()
	}
}

// pick takes the lane of the next call.
func (l *lanes) pick() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	best, bestOK := -1, false
	for k := range l.inFlight {
		i := (l.next + k) % len(l.inFlight)
		ok := now.Sub(l.failedAt[i]) >= laneBackoff
		if best < 0 || (ok && !bestOK) || (ok == bestOK && l.inFlight[i] < l.inFlight[best]) {
			best, bestOK = i, ok
		}
	}
	l.next = (best + 1) % len(l.inFlight)
	l.inFlight[best]++
	return best
}

// finish ends a call of lane i on partition p.
func (l *lanes) finish(i int, p uint32, ok bool) {
	now := time.Now()
	l.mu.Lock()
	l.inFlight[i]--
	if !ok {
		l.failedAt[i] = now
	}
	l.mu.Unlock()
	if ok && l.done != nil {
		l.done.add(p, now)
	}
}

func (l *lanes) upsert(ctx context.Context, table string, key, value []byte) (client.Result, error) {
	i := l.pick()
	res, err := l.cs[i].Upsert(ctx, table, wire.Bytes(key), wire.Bytes(value))
	l.finish(i, l.cs[i].Partition(wire.Bytes(key)), err == nil)
	res.Node = node.NodeName(i + 1) // a lane's client calls its node alone, answered or not
	return res, err
}

// read is a read of key; not found is a success. Its Result names the
// txn and the node that answered, as a write's does, so a history that
// is not linearizable says where each op ran.
func (l *lanes) read(ctx context.Context, table string, key []byte) (client.Result, error) {
	i := l.pick()
	c := l.cs[i]
	p := c.Partition(wire.Bytes(key))
	res, err := c.Call(ctx, p, partition.ProcRead, []wire.Value{wire.String(table), wire.Bytes(key)})
	l.finish(i, p, err == nil || isNotFound(err))
	res.Node = node.NodeName(i + 1)
	return res, err
}

// put is the volume writer's load.Put.
func (l *lanes) put(ctx context.Context, table string, key, value []byte) (txnid.ID, error) {
	res, err := l.upsert(ctx, table, key, value)
	return res.ID, err
}
