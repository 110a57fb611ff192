package node

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"net"
	"os"
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
