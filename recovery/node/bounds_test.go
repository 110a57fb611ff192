package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// storeMax raises a to v if v is larger.
func storeMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

func onePartition() layout.Config {
	return layout.Config{Partitions: 1, Replicas: 1, Tables: []layout.Table{layout.KV()}}
}

// tryClient dials a client connection and says hello; the error is the
// node's refusal, if it refuses.
func tryClient(t *testing.T, addr string) (*rawClient, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := stream.Dial(ctx, addr, stream.Config{Codec: wire.CodecNone, TLS: testCreds(t, certs.ClientID("test")).DialConfig("")})
	if err != nil {
		t.Fatal(err)
	}
	if err := hello(ctx, conn, &wire.Hello{Kind: wire.HelloClient, Node: "test"}, ""); err != nil {
		conn.Close()
		return nil, err
	}
	t.Cleanup(func() { conn.Close() })
	return &rawClient{conn: conn}, nil
}

// TestHelloDeadline: a connection that never completes its hello (no
// byte at all, or half a frame header) is closed once HelloTimeout has
// passed, while a connection that said hello in time stays open past it.
func TestHelloDeadline(t *testing.T) {
	c := newClusterStarting(t, 1, 0, onePartition())
	a := c.startCfg(1, func(cfg *Config) { cfg.HelloTimeout = 300 * time.Millisecond })
	cl := dialClient(t, a.TCP)
	waitWritable(t, cl, 1)

	dial := func() net.Conn {
		nc, err := net.DialTimeout("tcp", a.TCP, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return nc
	}
	silent, partial := dial(), dial()
	if _, err := partial.Write([]byte{0x01}); err != nil { // one byte of a frame header
		t.Fatal(err)
	}
	for name, nc := range map[string]net.Conn{"silent": silent, "partial": partial} {
		if err := nc.SetReadDeadline(time.Now().Add(15 * time.Second)); err != nil {
			t.Fatal(err)
		}
		n, err := nc.Read(make([]byte, 64))
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s dialer: connection still open 15 s after a hello deadline of 300 ms", name)
		}
		if err == nil {
			t.Fatalf("%s dialer: read %d bytes, want the connection closed", name, n)
		}
	}
	// The client that said hello in time is past the deadline and served.
	time.Sleep(600 * time.Millisecond)
	upsert(t, cl, 1, 1)
}

// TestConnsMax: past what clients may take of ConnsMax the node refuses
// a new client with a reply that says why, serves the connections it
// has, and takes a new one once a slot frees.
func TestConnsMax(t *testing.T) {
	const connsMax, reserved, clientsMax = 5, 1, 4
	c := newClusterStarting(t, 1, 0, onePartition())
	a := c.startCfg(1, func(cfg *Config) { cfg.ConnsMax, cfg.NodeConnsReserved = connsMax, reserved })
	first := dialClient(t, a.TCP)
	// The node's feed to itself is open, in process: it takes no slot
	// (initiator.selfFeed), so clientsMax clients fit.
	waitWritable(t, first, 1)
	open := []*rawClient{first}
	var refusal error
	for range clientsMax {
		cl, err := tryClient(t, a.TCP)
		if err != nil {
			refusal = err
			break
		}
		open = append(open, cl)
	}
	if refusal == nil {
		t.Fatalf("%d client connections accepted with ConnsMax %d, %d kept for nodes", len(open), connsMax, reserved)
	}
	if len(open) != clientsMax {
		t.Fatalf("%d client connections accepted with ConnsMax %d, %d kept for nodes, before a refusal, want %d: a feed of the node to itself took a slot", len(open), connsMax, reserved, clientsMax)
	}
	if !strings.Contains(refusal.Error(), "connection limit") {
		t.Fatalf("refusal %q does not say the connection limit was reached", refusal)
	}
	t.Logf("after %d clients: %v", len(open), refusal)
	for i, cl := range open {
		if _, err := cl.call(0, partition.ProcDigest, false); err != nil {
			t.Fatalf("client %d after the refusal: %v", i, err)
		}
	}
	resp, err := http.Get("http://" + a.HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "rejoin_conns_refused_total 1\n") {
		t.Errorf("/metrics does not count the refusal:\n%s", grepLines(string(body), "refused"))
	}
	open[len(open)-1].conn.Close()
	waitUntil(t, 10*time.Second, "a new client accepted once one closed", func() bool {
		cl, err := tryClient(t, a.TCP)
		if err != nil {
			return false
		}
		cl.conn.Close()
		return true
	})
}

// TestClientBackPressure: a client pipelines reads whose replies it does
// not read. Once the node's replies stop draining, the bytes the
// connection has in flight stay within ClientBytesMax plus the replies of
// the calls already admitted, and the node stops reading the connection
// rather than close it. When the client reads again, every call is
// answered, in order.
func TestClientBackPressure(t *testing.T) {
	const (
		bytesMax = 512 << 10
		calls    = 600
		keyBytes = 32 << 10
		valBytes = 32 << 10
	)
	var peak atomic.Int64
	var read atomic.Int64
	c := newClusterStarting(t, 1, 0, onePartition())
	a := c.startCfg(1, func(cfg *Config) {
		cfg.ClientBytesMax = bytesMax
		cfg.knobs.clientBytes = func(inflight int64, n int) {
			storeMax(&peak, inflight)
			storeMax(&read, int64(n))
		}
	})
	cl := dialClient(t, a.TCP)
	waitWritable(t, cl, 1)
	// Random bytes, so that the node's frames do not compress.
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) wire.Value {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return wire.Bytes(b)
	}
	key := random(keyBytes)
	if _, err := cl.call(0, partition.ProcUpsert, false, wire.String("kv"), key, random(valBytes)); err != nil {
		t.Fatal(err)
	}
	params, err := wire.NewTupleEncoder().AppendTuple(nil, []wire.Value{wire.String("kv"), key})
	if err != nil {
		t.Fatal(err)
	}
	before := read.Load()
	first := cl.req + 1

	var sent atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range uint64(calls) {
			// Send blocks once the node stops reading and TCP's buffers
			// are full; the test's reads below unblock it.
			if err := cl.conn.Send(context.Background(), &wire.Call{Req: first + i, Partition: 0, Proc: partition.ProcRead, Params: params}); err != nil {
				return
			}
			sent.Add(1)
		}
	}()
	defer wg.Wait()
	defer func() {
		if t.Failed() {
			cl.conn.Close() // unblock the sender
		}
	}()

	// Wait until the node has stopped reading: its count of calls read
	// holds still for a second.
	last, since := read.Load(), time.Now()
	waitUntil(t, 60*time.Second, "the node to stop reading the client", func() bool {
		if n := read.Load(); n != last {
			last, since = n, time.Now()
			return false
		}
		return time.Since(since) > time.Second
	})
	admitted := read.Load() - before
	callBytes := int64(len(params) + len(partition.ProcRead) + clientCallOverheadBytes)
	replyBytes := int64(keyBytes + valBytes + 64 + clientCallOverheadBytes)
	bound := bytesMax + (bytesMax/callBytes+1)*replyBytes
	t.Logf("client sent %d calls, node read %d, peak in flight %d bytes (bound %d)", sent.Load(), admitted, peak.Load(), bound)
	if admitted >= calls {
		t.Fatalf("the node read all %d calls while the client read no reply", calls)
	}
	if p := peak.Load(); p > bound {
		t.Fatalf("peak bytes in flight %d, want <= %d (ClientBytesMax %d and the replies of the calls admitted)", p, bound, bytesMax)
	}

	for i := range uint64(calls) {
		m, err := cl.conn.Recv()
		if err != nil {
			t.Fatalf("reply %d of %d: %v", i+1, calls, err)
		}
		r, ok := m.(*wire.Reply)
		switch {
		case !ok:
			t.Fatalf("reply %d: got %v", i+1, m.Type())
		case r.Err != "":
			t.Fatalf("reply %d: %s", i+1, r.Err)
		case r.Req != first+i:
			t.Fatalf("reply %d answers call %d, want %d: out of order", i+1, r.Req-first+1, i+1)
		case len(r.Out) < keyBytes+valBytes:
			t.Fatalf("reply %d: %d bytes of output, want the row (%d bytes and more)", i+1, len(r.Out), keyBytes+valBytes)
		}
	}
	wg.Wait()
	if n := sent.Load(); n != calls {
		t.Fatalf("%d calls sent, want %d", n, calls)
	}
}

// TestRejoinBufferHoldsSource: writes go on while a rejoin's stream is
// held mid-snapshot. Once the destination's buffer passes half of
// RejoinBufferBytesMax, its source holds the partition's execution: the
// writes wait instead of the buffer growing or the attempt aborting, and
// when the stream moves again the rejoin ends live, the waiting writes
// are answered, and the replicas agree.
func TestRejoinBufferHoldsSource(t *testing.T) {
	const bufferMax = 64 << 10
	c := newClusterStarting(t, 2, 0, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	small := func(cfg *Config) { cfg.RejoinBufferBytesMax = bufferMax }
	c.startCfg(1, small)
	c.startCfg(2, small)
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	rows := make([]wire.Value, 0, 2+2*400)
	for b := range 100 {
		rows = append(rows[:0], wire.String("kv"), wire.Int64(400))
		for i := range 400 {
			rows = append(rows, wire.Bytes(fmt.Appendf(nil, "key-%08d", b*400+i)), wire.Bytes(make([]byte, 1000)))
		}
		if _, err := cl.call(0, partition.ProcUpsertMany, false, rows...); err != nil {
			t.Fatal(err)
		}
	}
	c.stop(2)
	fault(t, c.nodes[1].addrs, "/fault/hold?partition=0&rows=10000")
	a2 := c.startCfg(2, small)
	var sent int64
	waitUntil(t, 20*time.Second, "the source to hold mid-snapshot", func() bool {
		st := nodeStatus(t, c.nodes[1].addrs)
		if len(st.Replicas[0].Sources) == 1 && st.Replicas[0].Sources[0].Held {
			sent = st.Replicas[0].Sources[0].Rows
			return true
		}
		return false
	})
	// The writes start once the destination has applied what the source
	// sent, and each waits until the destination has buffered the one
	// before: the source runs a write without waiting for the destination
	// (its heartbeats lead), so a destination that lags a few ms would
	// take in dozens at once, past its hold mark and its limit before the
	// source hears of the hold, and end the attempt (a buffer full despite
	// the hold), which is not what this test is of.
	waitUntil(t, 20*time.Second, "the destination to apply what was sent", func() bool {
		rj := nodeStatus(t, a2).Replicas[0].Rejoin
		return rj != nil && rj.Rows >= sent
	})
	// buffered is the destination's buffer peak, and whether it still
	// buffers (it does until live).
	buffered := func() (int64, bool, error) {
		resp, err := http.Get("http://" + a2.HTTP + "/status")
		if err != nil {
			return 0, false, err
		}
		defer resp.Body.Close()
		var st Status
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return 0, false, err
		}
		rs := st.Replicas[0]
		if rs.Rejoin == nil {
			return 0, rs.State == recovery.ReplicaRejoining, nil
		}
		return rs.Rejoin.BufferBytesPeak, rs.State == recovery.ReplicaRejoining, nil
	}
	waitBuffered := func(above int64) (int64, error) {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			b, rejoining, err := buffered()
			if err != nil || b > above || !rejoining {
				return b, err
			}
		}
		return 0, fmt.Errorf("the destination's buffer stayed at %d bytes for 10 s", above)
	}

	// Writes of ~1 KB, one at a time: each waits for the source.
	const writes = 200
	writer := dialClient(t, c.nodes[1].addrs.TCP)
	var done atomic.Int64
	werr := make(chan error, 1)
	go func() {
		var peak int64
		for i := range writes {
			key := wire.Bytes(fmt.Appendf(nil, "new-%08d", i))
			if _, err := writer.call(0, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes(make([]byte, 1000))); err != nil {
				werr <- fmt.Errorf("write %d: %w", i, err)
				return
			}
			done.Add(1)
			var err error
			if peak, err = waitBuffered(peak); err != nil {
				werr <- fmt.Errorf("write %d: %w", i, err)
				return
			}
		}
		werr <- nil
	}()
	defer func() {
		if t.Failed() {
			writer.conn.Close() // unblock the writer
		}
	}()
	var src RejoinStatus
	waitUntil(t, 20*time.Second, "the source to hold for the destination", func() bool {
		src = nodeStatus(t, c.nodes[1].addrs).Replicas[0].Sources[0]
		return src.PeerHoldMs > 0
	})
	held := done.Load()
	time.Sleep(300 * time.Millisecond)
	dst := nodeStatus(t, a2).Replicas[0]
	t.Logf("hold after %d writes; %d after 300 ms more; destination %s, buffer peak %d bytes", held, done.Load(), dst.Rejoin.Phase, dst.Rejoin.BufferBytesPeak)
	if n := done.Load(); n >= writes {
		t.Fatalf("all %d writes answered while the source held", n)
	}
	if dst.State != recovery.ReplicaRejoining || dst.Rejoin.Err != "" {
		t.Fatalf("destination %s (%s), want still rejoining", dst.State, dst.Rejoin.Err)
	}
	if p := dst.Rejoin.BufferBytesPeak; p <= bufferMax/2 || p > bufferMax {
		t.Fatalf("buffer peak %d bytes, want past the mark %d and within %d", p, bufferMax/2, bufferMax)
	}

	fault(t, c.nodes[1].addrs, "/fault/release?partition=0")
	waitUntil(t, 30*time.Second, "the destination live", func() bool {
		return nodeStatus(t, a2).Replicas[0].State == recovery.ReplicaLive
	})
	select {
	case err := <-werr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("writes still waiting 30 s after the handoff (%d of %d answered)", done.Load(), writes)
	}
	checkDigests(t, cl, 1, 2)
}

// TestHelloConnDeadline: the hello deadline bounds the node's answer too
// (a dialer that does not read it), and the first write that goes through
// lifts it for reads and writes alike.
func TestHelloConnDeadline(t *testing.T) {
	const timeout = 100 * time.Millisecond
	// net.Pipe has no buffer: a write waits for the peer to read.
	a, b := net.Pipe()
	defer b.Close()
	hc, err := newHelloConn(a, timeout)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hc.Write([]byte("answer")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("answer to a dialer that does not read: %v, want the deadline exceeded", err)
	}
	hc.Close()

	a, b = net.Pipe()
	defer b.Close()
	if hc, err = newHelloConn(a, timeout); err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	got := make(chan error, 2)
	go func() {
		buf := make([]byte, 6)
		for range 2 {
			_, err := io.ReadFull(b, buf)
			got <- err
		}
	}()
	if _, err := hc.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * timeout)
	if _, err := hc.Write([]byte("later!")); err != nil {
		t.Fatalf("a write past the hello deadline after the answer: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(2 * timeout)
		_, _ = b.Write([]byte{1})
	}()
	if _, err := hc.Read(make([]byte, 1)); err != nil {
		t.Fatalf("a read past the hello deadline after the answer: %v", err)
	}
}
