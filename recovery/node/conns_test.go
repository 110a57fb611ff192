package node

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// flakyListener fails Accept as a process out of descriptors does
// (EMFILE), fail times, then accepts again.
type flakyListener struct {
	net.Listener
	fail   atomic.Int32
	failed atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fail.Add(-1) >= 0 {
		l.failed.Add(1)
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	l.fail.Store(0)
	return l.Listener.Accept()
}

// TestAcceptSurvivesTemporaryErrors (issue 24, 1): Accept failing with
// EMFILE for a while neither closes the connections open nor stops the
// node from accepting once it works again.
func TestAcceptSurvivesTemporaryErrors(t *testing.T) {
	const fails = 8
	fl := &flakyListener{}
	c := newClusterStarting(t, 1, 0, onePartition())
	a := c.startCfg(1, func(cfg *Config) {
		cfg.knobs.listener = func(ln net.Listener) net.Listener { fl.Listener = ln; return fl }
	})
	before := dialClient(t, a.TCP)
	waitWritable(t, before, 1)
	// The next Accept after this client's fails fails times in a row.
	fl.fail.Store(fails)
	during := dialClient(t, a.TCP)
	waitUntil(t, 10*time.Second, "Accept to have failed", func() bool { return fl.failed.Load() > 0 })
	after, err := tryClient(t, a.TCP)
	if err != nil {
		t.Fatalf("a client dialled after %d failed Accepts: %v", fl.failed.Load(), err)
	}
	for name, cl := range map[string]*rawClient{"before": before, "during": during, "after": after} {
		if _, err := cl.call(0, partition.ProcDigest, false); err != nil {
			t.Errorf("client dialled %s the failed Accepts: %v", name, err)
		}
	}
	if got := fl.failed.Load(); got != fails {
		t.Errorf("%d failed Accepts, want %d", got, fails)
	}
}

// TestSilentConnsDoNotLockOutClients (issue 24, 2): hundreds of TCP
// connections that never start TLS, and more arriving all the while, do
// not keep a client with a certificate from being served.
func TestSilentConnsDoNotLockOutClients(t *testing.T) {
	const (
		burst     = 300 // over ConnsMaxDefault, at once
		perSecond = 50
		tries     = 5
	)
	c := newClusterStarting(t, 1, 0, onePartition())
	a := c.startCfg(1, nil)
	first := dialClient(t, a.TCP)
	waitWritable(t, first, 1)

	var mu sync.Mutex
	var silent []net.Conn
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, nc := range silent {
			nc.Close()
		}
	}()
	dialSilent := func() {
		nc, err := net.DialTimeout("tcp", a.TCP, 5*time.Second)
		if err != nil {
			return // the listen queue may be full: a refused dial is no silent connection
		}
		mu.Lock()
		silent = append(silent, nc)
		mu.Unlock()
	}
	for range burst {
		dialSilent()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / perSecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				dialSilent()
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()
	for i := range tries {
		cl, err := tryClient(t, a.TCP)
		if err != nil {
			mu.Lock()
			n := len(silent)
			mu.Unlock()
			t.Fatalf("client %d of %d, after %d silent connections: %v", i+1, tries, n, err)
		}
		if _, err := cl.call(0, partition.ProcDigest, false); err != nil {
			t.Fatalf("client %d: %v", i+1, err)
		}
		cl.conn.Close()
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := first.call(0, partition.ProcDigest, false); err != nil {
		t.Errorf("the client connected before the silent ones: %v", err)
	}
}

// TestClientsLeaveNodeSlots (issue 24, 2): clients that fill what they
// may of ConnsMax leave slots for nodes: a peer's stream is still served.
func TestClientsLeaveNodeSlots(t *testing.T) {
	const connsMax = 4
	c := newClusterStarting(t, 2, 0, onePartition())
	a := c.startCfg(1, func(cfg *Config) { cfg.ConnsMax = connsMax })
	var refusal error
	for range connsMax + 1 {
		if _, err := tryClient(t, a.TCP); err != nil {
			refusal = err
			break
		}
	}
	if refusal == nil || !strings.Contains(refusal.Error(), "connection limit") {
		t.Fatalf("%d clients and no refusal of the connection limit (%v)", connsMax+1, refusal)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn := dialAs(t, ctx, a.TCP, certs.NodeID(2), "n1")
	defer conn.Close()
	if err := hello(ctx, conn, &wire.Hello{Kind: wire.HelloRepair, Node: "n2"}, "n1"); err != nil {
		t.Fatalf("a node's repair stream with the clients' slots full: %v", err)
	}
}

// TestHelloFrameCapped (issue 24, 5): a frame announcing 8 MiB where the
// hello is due is refused at once, with a reply that says why, rather
// than waited for (and its buffer allocated) before the hello is
// checked.
func TestHelloFrameCapped(t *testing.T) {
	c := newClusterStarting(t, 1, 0, onePartition())
	a := c.startCfg(1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", a.TCP)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	tc := tls.Client(nc, testCreds(t, certs.ClientID("test")).DialConfig(""))
	if err := tc.HandshakeContext(ctx); err != nil {
		t.Fatal(err)
	}
	var head [wire.FrameHeaderBytes]byte
	binary.BigEndian.PutUint32(head[0:], wire.FrameBytesMax)
	head[4], head[5] = byte(wire.MsgHello), byte(wire.CodecNone)
	binary.BigEndian.PutUint32(head[6:], wire.FrameBytesMax)
	if _, err := tc.Write(append(head[:], 0x98, 0x01)); err != nil {
		t.Fatal(err)
	}
	sc := stream.NewConn(tc, stream.Config{Codec: wire.CodecNone})
	if err := tc.SetReadDeadline(time.Now().Add(HelloTimeoutDefault / 2)); err != nil {
		t.Fatal(err)
	}
	m, err := sc.Recv()
	if err != nil {
		t.Fatalf("no answer to a hello frame announcing %d bytes: %v", wire.FrameBytesMax, err)
	}
	r, ok := m.(*wire.Reply)
	if !ok || !strings.Contains(r.Err, "too large") {
		t.Fatalf("answer %#v, want a reply that the hello frame is too large", m)
	}
	t.Logf("refused: %s", r.Err)
}

// TestClientIdleClosed (issue 24, 2): a client connection that sends no
// call for ClientIdleTimeout is closed; one that keeps calling is not.
func TestClientIdleClosed(t *testing.T) {
	const idle = 300 * time.Millisecond
	c := newClusterStarting(t, 1, 0, onePartition())
	a := c.startCfg(1, func(cfg *Config) { cfg.ClientIdleTimeout = idle })
	quiet, busy := dialClient(t, a.TCP), dialClient(t, a.TCP)
	waitWritable(t, quiet, 1)
	closed := make(chan error, 1)
	go func() {
		_, err := quiet.conn.Recv()
		closed <- err
	}()
	for range 12 {
		if _, err := busy.call(0, partition.ProcDigest, false); err != nil {
			t.Fatalf("a client calling every 100 ms, idle timeout %v: %v", idle, err)
		}
		time.Sleep(idle / 3)
	}
	select {
	case err := <-closed:
		if err == nil {
			t.Fatal("the idle client got a frame, not its connection closed")
		}
	case <-time.After(10 * time.Second):
		quiet.conn.Close()
		<-closed
		t.Fatalf("an idle client connection still open 10 s past an idle timeout of %v", idle)
	}
}

// TestHandshakesPool: a full pool, or a source at its bound, makes room
// by its oldest connection that has sent nothing, else its oldest; one
// source's connections never push out another's while the pool has
// room; out of descriptors, a silent one is given up first.
func TestHandshakesPool(t *testing.T) {
	hs := newHandshakes(4, 2)
	admit := func(source string) *pendingConn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		p, evicted := hs.admit(a, source)
		if evicted != nil {
			t.Fatalf("admitting from %s evicted one of %s with room left", source, evicted.source)
		}
		return p
	}
	a1, a2 := admit("a"), admit("a")
	b1 := admit("b")
	a1.heard.Store(true) // a1 spoke, a2 is silent
	_, evicted := hs.admit(nil, "a")
	if evicted != a2 {
		t.Fatalf("source a at its bound evicted %v, want its silent one", evicted)
	}
	if hs.leave(a2) {
		t.Fatal("leave of an evicted connection reports it served")
	}
	admit("d") // the pool is full: a1, b1, a3, d
	_, evicted = hs.admit(nil, "c")
	if evicted != b1 {
		t.Fatalf("a full pool evicted %v, want the oldest silent one (b1)", evicted)
	}
	if !hs.leave(a1) || len(hs.pending) != 3 {
		t.Fatalf("leave of a1: pool %d, want 3", len(hs.pending))
	}
	if p := hs.evictSilent(); p != nil {
		t.Fatalf("evictSilent took %s's, silent for less than %v", p.source, silentMin)
	}
	for _, p := range hs.pending {
		p.since = p.since.Add(-silentMin)
	}
	if p := hs.evictSilent(); p == nil || p.heard.Load() {
		t.Fatalf("evictSilent: %v", p)
	}
	if n := hs.bySource["a"] + hs.bySource["b"] + hs.bySource["c"] + hs.bySource["d"]; n != len(hs.pending) || hs.bySource["b"] != 0 {
		t.Fatalf("per-source counts %v, pool %d", hs.bySource, len(hs.pending))
	}
}

// gatedConn lets its first write (a TLS ClientHello) through and holds
// the later ones until open is closed; held is closed at the first one
// held, once the node's answer to the ClientHello has been read.
type gatedConn struct {
	net.Conn
	writes   atomic.Int32
	heldOnce sync.Once
	held     chan struct{}
	open     chan struct{}
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if c.writes.Add(1) > 1 {
		c.heldOnce.Do(func() { close(c.held) })
		<-c.open
	}
	return c.Conn.Write(b)
}

// TestOneByteDoesNotOutrankAHandshake (issue 24, 2): connections that
// send one byte of a TLS record and nothing more rank with silent ones
// in the handshakes pool, below a dialler whose ClientHello the node has
// answered: a flood of them cannot push a real client's handshake out.
// The pool holds two, so the second flood connection must evict one.
func TestOneByteDoesNotOutrankAHandshake(t *testing.T) {
	c := newClusterStarting(t, 1, 0, onePartition())
	a := c.startCfg(1, func(cfg *Config) { cfg.HandshakesMax, cfg.HandshakesPerSourceMax = 2, 2 })
	first := dialClient(t, a.TCP)
	waitWritable(t, first, 1)

	nc, err := net.DialTimeout("tcp", a.TCP, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	gc := &gatedConn{Conn: nc, held: make(chan struct{}), open: make(chan struct{})}
	opened := false
	openGate := func() {
		if !opened {
			opened = true
			close(gc.open)
		}
	}
	defer openGate()
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		tc := tls.Client(gc, testCreds(t, certs.ClientID("test")).DialConfig(""))
		defer tc.Close()
		if err := tc.HandshakeContext(ctx); err != nil {
			errc <- err
			return
		}
		conn := stream.NewConn(tc, stream.Config{Codec: wire.CodecNone})
		defer conn.Close()
		errc <- hello(ctx, conn, &wire.Hello{Kind: wire.HelloClient, Node: "test"}, "")
	}()
	select {
	case <-gc.held:
	case err := <-errc:
		t.Fatalf("the client's handshake ended before its second flight: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to the client's ClientHello within 10 s")
	}

	oneByte := func() net.Conn {
		nc, err := net.DialTimeout("tcp", a.TCP, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		if _, err := nc.Write([]byte{0x16}); err != nil { // a handshake record's first byte
			t.Fatal(err)
		}
		return nc
	}
	oneByte()
	// Time for the node to read that byte, so that its connection ranks
	// by what it sent and not by whether its goroutine ran yet.
	time.Sleep(300 * time.Millisecond)
	evictedBefore := evictedCount(t, a.HTTP)
	oneByte() // the pool is full: one of the two before goes
	waitUntil(t, 10*time.Second, "a connection of the handshakes pool to be evicted", func() bool {
		return evictedCount(t, a.HTTP) > evictedBefore
	})
	openGate()
	if err := <-errc; err != nil {
		t.Fatalf("a client whose ClientHello the node answered, evicted for a connection that sent one byte: %v", err)
	}
}

// evictedCount reads rejoin_conns_evicted_total from the node's metrics.
func evictedCount(t *testing.T, httpAddr string) float64 {
	t.Helper()
	b := getBody(t, "http://"+httpAddr+"/metrics", http.StatusOK)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rejoin_conns_evicted_total "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return f
		}
	}
	t.Fatal("no rejoin_conns_evicted_total in /metrics")
	return 0
}

// TestHeardConn: on a TLS node a pending connection is heard once the
// node answers it (its first write comes after a whole ClientHello), not
// at the dialler's first byte; on an insecure node, which writes nothing
// before the hello, at the first byte.
func TestHeardConn(t *testing.T) {
	for _, secure := range []bool{true, false} {
		a, b := net.Pipe()
		p := &pendingConn{}
		hc := heardConn{Conn: b, p: p, tls: secure}
		go func() { _, _ = a.Write([]byte{0x16}) }()
		if _, err := hc.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		if got := p.heard.Load(); got == secure {
			t.Errorf("tls=%v: heard=%v after one byte read", secure, got)
		}
		go func() { _, _ = io.Copy(io.Discard, a) }()
		if _, err := hc.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		if !p.heard.Load() {
			t.Errorf("tls=%v: not heard after the node's first write", secure)
		}
		a.Close()
		b.Close()
	}
}
