package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
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

// TestStopSaysGoaway: a client connection pipelining calls into a node
// as it stops gracefully ends with the node's goaway (a Reply numbered 0,
// wire.RefusedStopping) and then the node's close, nothing in between;
// every call answered before it ran or was refused, and every call left
// unanswered ran nowhere: its key is on no replica. Without the goaway
// the connection just closed, and a client could not tell the calls the
// node had not read from those it had (TestGracefulStopUnderLoad, under
// -race in CI: one write uncertain).
func TestStopSaysGoaway(t *testing.T) {
	const parts = 2
	const callsMax = 20000
	c := newCluster(t, 2, layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	check := dialClient(t, c.nodes[2].addrs.TCP)
	waitWritable(t, check, parts)
	rc := dialClient(t, c.nodes[1].addrs.TCP)
	keyOf := func(req uint64) (uint32, wire.Value) {
		key := wire.Bytes(fmt.Appendf(nil, "goaway-%06d", req))
		p, err := partition.RouteValues([]wire.Value{key}, parts)
		if err != nil {
			t.Fatal(err)
		}
		return p, key
	}
	var sent atomic.Uint64
	stopSending, refusedSeen := make(chan struct{}), make(chan struct{})
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		enc := wire.NewTupleEncoder()
		burst := uint64(0) // the last call of the burst after the pause
		for req := uint64(1); req <= callsMax && (burst == 0 || req <= burst); req++ {
			select {
			case <-stopSending:
				return
			case <-refusedSeen:
				if burst == 0 {
					// A client sends on after the node said it stops, past
					// the quiet the node waits for: its calls come as the
					// node stops reading.
					time.Sleep(callsQuiet + 100*time.Millisecond)
					burst = req + 100
				}
			default:
			}
			p, key := keyOf(req)
			params, err := enc.AppendTuple(nil, []wire.Value{wire.String("kv"), key, wire.Bytes([]byte("v"))})
			if err != nil {
				t.Error(err)
				return
			}
			if err := rc.conn.Send(context.Background(), &wire.Call{Req: req, Partition: p, Proc: partition.ProcUpsert, Params: params}); err != nil {
				return
			}
			sent.Store(req)
			if req%64 == 0 {
				time.Sleep(time.Millisecond) // a pipeline, not a flood
			}
		}
	}()
	answered := map[uint64]wire.Refusal{}
	var goaway *wire.Reply
	refused := 0
	recvDone := make(chan error, 1)
	go func() {
		defer close(stopSending)
		for {
			m, err := rc.conn.Recv()
			if err != nil {
				recvDone <- err
				return
			}
			r, ok := m.(*wire.Reply)
			switch {
			case !ok:
				recvDone <- fmt.Errorf("got %v", m)
				return
			case goaway != nil:
				recvDone <- fmt.Errorf("reply %d after the goaway", r.Req)
				return
			case r.Req == 0:
				if r.Refused != wire.RefusedStopping {
					recvDone <- fmt.Errorf("reply numbered 0, refused %v: %s", r.Refused, r.Err)
					return
				}
				goaway = &wire.Reply{Refused: r.Refused, Err: r.Err}
			case r.Err != "" && r.Refused == wire.RefusedNone:
				recvDone <- fmt.Errorf("call %d: %s", r.Req, r.Err)
				return
			default:
				answered[r.Req] = r.Refused
				if r.Refused == wire.RefusedStopping && refused == 0 {
					close(refusedSeen)
				}
				if r.Refused != wire.RefusedNone {
					refused++
				}
			}
		}
	}()
	waitUntil(t, 10*time.Second, "calls flowing", func() bool { return sent.Load() > 500 })
	c.stop(1)
	err := <-recvDone
	<-sendDone
	if goaway == nil {
		t.Fatalf("the connection ended without a goaway: %v (%d calls sent, %d answered)", err, sent.Load(), len(answered))
	}
	if !errors.Is(err, io.EOF) {
		t.Fatalf("after the goaway: %v, want the node's close", err)
	}
	ran, unanswered := 0, 0
	for req := uint64(1); req <= sent.Load(); req++ {
		p, key := keyOf(req)
		why, ok := answered[req]
		if ok && why == wire.RefusedNone {
			ran++
			if _, err := check.call(p, partition.ProcRead, false, wire.String("kv"), key); err != nil {
				t.Fatalf("call %d acknowledged before the goaway: read on n2: %v", req, err)
			}
			continue
		}
		if !ok {
			unanswered++
		}
		if _, err := check.call(p, partition.ProcRead, false, wire.String("kv"), key); err == nil {
			t.Fatalf("call %d (refused %v, answered %v) ran: its key is on n2", req, why, ok)
		}
	}
	t.Logf("%d calls sent: %d ran, %d refused, %d not answered before the goaway (%q)", sent.Load(), ran, refused, unanswered, goaway.Err)
}
