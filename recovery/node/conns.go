package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// The accept side: every connection starts with a hello that names its
// kind (client, feed, rejoin, repair), checked against the peer's
// certificate (auth.go) within the bounds below; a client's calls are
// served here, the others by their owners (feed.go, destination.go,
// repair.go).

// The bounds of accepted connections (Config.ConnsMax, HandshakesMax,
// HelloTimeout, ClientIdleTimeout, ClientBytesMax; docs/DESIGN.md
// "Bounds" and "Who may talk to a node").
const (
	// refuseDrainBytesMax bounds what a refusal reads of the dialer's input
	// while it waits for the dialer to close.
	refuseDrainBytesMax = 64 << 10
	// clientCallOverheadBytes is what a client call in flight costs beyond
	// its bytes: the call, its copy, the initiator's pending entry, the
	// reply and its queue slot. It also bounds the calls in flight per
	// connection to ClientBytesMax / clientCallOverheadBytes + 1.
	clientCallOverheadBytes = 512
	// acceptBackoffMin and acceptBackoffMax bound the wait after a failed
	// Accept, doubling from one to the other as net/http's Server does:
	// a process out of descriptors gets them back as connections close.
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
	// silentMin is how long a connection must have sent nothing for a
	// failed Accept to close it: a dialler sends its ClientHello at once.
	silentMin = 250 * time.Millisecond
)

// helloConn is an accepted connection whose hello is not done yet: reads
// and writes have the hello deadline until the node's first write, which
// is its answer to the hello (a Hello, or a Reply that refuses). The node
// writes nothing before it has read the hello, so one deadline covers
// the TLS handshake, the dialer's hello and the node's answer.
type helloConn struct {
	net.Conn
	answered atomic.Bool
}

func newHelloConn(nc net.Conn, timeout time.Duration) (*helloConn, error) {
	if err := nc.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	return &helloConn{Conn: nc}, nil
}

// Write writes b and, on the first write, lifts the hello deadline: from
// then on the connection's own kind (a feed, a client, a rejoin) sets the
// rules.
func (h *helloConn) Write(b []byte) (int, error) {
	n, err := h.Conn.Write(b)
	if err == nil && !h.answered.Swap(true) {
		err = h.Conn.SetDeadline(time.Time{})
	}
	return n, err
}

// CloseWrite shuts down the sending side, as a TCP connection does
// (stream.Conn.CloseWrite looks for it).
func (h *helloConn) CloseWrite() error {
	if cw, ok := h.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// handshakes is the pool of accepted connections that have not finished
// TLS and their hello: nobody is accountable for them yet, so they hold
// no slot of ConnsMax, and their own pool is bounded in all and per
// source address. A full pool makes room by closing one of its own: the
// oldest not heard yet (heardConn: a dialler that speaks TLS sends its
// ClientHello at once, and the node answers it), or else the oldest. So
// a flood of connections shortens the lives of its own, and a dialler
// whose handshake and hello take less than that life is always served;
// closing the new one instead would let the flood, renewed within the
// hello deadline, lock every dialler out.
type handshakes struct {
	max, perSourceMax int

	mu       sync.Mutex
	pending  []*pendingConn // oldest first; HandshakesMax at most
	bySource map[string]int
}

// pendingConn is a connection of the handshakes pool.
type pendingConn struct {
	raw    net.Conn
	source string
	since  time.Time   // accepted
	heard  atomic.Bool // the dialler said something worth an answer (heardConn)
	gone   bool        // out of the pool (under handshakes.mu)
	closed bool        // closed to make room (under handshakes.mu)
}

func newHandshakes(max, perSourceMax int) *handshakes {
	return &handshakes{max: max, perSourceMax: perSourceMax, bySource: map[string]int{}}
}

// admit puts a connection from source in the pool and returns it, and
// the one taken out to make room, if any, which the caller closes.
func (hs *handshakes) admit(raw net.Conn, source string) (p, evicted *pendingConn) {
	p = &pendingConn{raw: raw, source: source, since: time.Now()}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	switch {
	case hs.bySource[source] >= hs.perSourceMax:
		evicted = hs.victimLocked(source)
	case len(hs.pending) >= hs.max:
		evicted = hs.victimLocked("")
	}
	if evicted != nil {
		hs.removeLocked(evicted)
		evicted.closed = true
	}
	hs.pending = append(hs.pending, p)
	hs.bySource[source]++
	return p, evicted
}

// evictSilent takes the oldest connection not heard for silentMin out
// of the pool and returns it for the caller to close; nil if there is
// none. A younger one may be a dialler whose ClientHello its goroutine
// has not answered yet.
func (hs *handshakes) evictSilent() *pendingConn {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for _, p := range hs.pending {
		if !p.heard.Load() && time.Since(p.since) >= silentMin {
			hs.removeLocked(p)
			p.closed = true
			return p
		}
	}
	return nil
}

// victimLocked is the connection to close for a new one: of source, or
// of any if source is empty, the oldest not heard, else the oldest.
func (hs *handshakes) victimLocked(source string) *pendingConn {
	var oldest *pendingConn
	for _, p := range hs.pending {
		if source != "" && p.source != source {
			continue
		}
		if !p.heard.Load() {
			return p
		}
		if oldest == nil {
			oldest = p
		}
	}
	return oldest
}

func (hs *handshakes) removeLocked(p *pendingConn) {
	if i := slices.Index(hs.pending, p); i >= 0 {
		hs.pending = slices.Delete(hs.pending, i, i+1)
	}
	if hs.bySource[p.source]--; hs.bySource[p.source] <= 0 {
		delete(hs.bySource, p.source)
	}
	p.gone = true
}

// leave takes p out of the pool, once its hello is checked or it ends.
// It reports false if p was closed to make room meanwhile.
func (hs *handshakes) leave(p *pendingConn) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if !p.gone {
		hs.removeLocked(p)
	}
	return !p.closed
}

// heardConn marks its pendingConn heard. On a TLS node that is at the
// node's first write, which answers a whole, valid ClientHello: marked at
// the first byte, a flood of connections that each sent one byte ranked
// with real diallers and pushed their handshakes out (at 200 a second
// from loopback, 3 clients in 15 failed). An insecure node writes
// nothing before the hello, so there it is the first byte read.
type heardConn struct {
	net.Conn
	p   *pendingConn
	tls bool
}

func (c heardConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && !c.tls && !c.p.heard.Load() {
		c.p.heard.Store(true)
	}
	return n, err
}

func (c heardConn) Write(b []byte) (int, error) {
	if !c.p.heard.Load() {
		c.p.heard.Store(true)
	}
	return c.Conn.Write(b)
}

// CloseWrite passes a TCP half-close on (an insecure node's refusals).
func (c heardConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// sourceOf is the address a connection's per-source bound counts by: its
// IP, without the port.
func sourceOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// slots counts the connections served past their hello against ConnsMax,
// clients apart: they may take all but NodeConnsReserved of it.
type slots struct {
	max, clientsMax int

	mu             sync.Mutex
	nodes, clients int
}

// take takes a slot for a client or a node connection; false if none is
// left for it, with the connections open.
func (s *slots) take(client bool) (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	open := s.nodes + s.clients
	if open >= s.max || (client && s.clients >= s.clientsMax) {
		return false, open
	}
	if client {
		s.clients++
	} else {
		s.nodes++
	}
	return true, open + 1
}

func (s *slots) release(client bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if client {
		s.clients--
	} else {
		s.nodes--
	}
}

// clientBudget bounds the bytes one client connection has in flight:
// calls read and not yet answered, and replies queued and not yet
// written. Its one reader waits in acquire; replies add without waiting,
// since the txn has run by then and its answer cannot be refused.
//
// Invariant: the calls' bytes stay within max (a lone call larger than max
// may still pass alone, so a client is never stuck); used exceeds max
// only by replies of calls already admitted.
type clientBudget struct {
	max   int64
	freed chan struct{} // a release happened; capacity 1: one waiter

	mu   sync.Mutex
	used int64
}

func newClientBudget(max int64) *clientBudget {
	return &clientBudget{max: max, freed: make(chan struct{}, 1)}
}

// callsMax is the most calls the budget lets be in flight at once.
func (b *clientBudget) callsMax() int { return int(b.max/clientCallOverheadBytes) + 1 }

// acquire waits until w more bytes fit, or nothing is in flight, and
// takes them; the error is ctx's if it ends first.
func (b *clientBudget) acquire(ctx context.Context, w int64) (int64, error) {
	for {
		b.mu.Lock()
		if b.used == 0 || b.used+w <= b.max {
			b.used += w
			used := b.used
			b.mu.Unlock()
			return used, nil
		}
		b.mu.Unlock()
		select {
		case <-b.freed:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// add takes w bytes without waiting and returns the bytes in flight.
func (b *clientBudget) add(w int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used += w
	return b.used
}

// idle reports whether nothing is in flight: no call unanswered, no
// reply unwritten.
func (b *clientBudget) idle() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used == 0
}

// release gives w bytes back and wakes the reader.
func (b *clientBudget) release(w int64) {
	b.mu.Lock()
	b.used -= w
	if b.used < 0 {
		panic(fmt.Sprintf("node: client budget released below zero (%d)", b.used))
	}
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

// callBytes is what a call costs in a client's budget while in flight.
func callBytes(c *wire.Call) int64 {
	return int64(len(c.Proc)+len(c.Params)) + clientCallOverheadBytes
}

// replyBytes is what a reply costs in a client's budget until written.
func replyBytes(r *wire.Reply) int64 {
	n := len(r.Out) + len(r.Err)
	for _, e := range r.Each {
		n += len(e.Node) + len(e.Out) + len(e.Err)
	}
	return int64(n)
}

// clientReply is a reply queued for a client connection, with the bytes
// of the call and the reply that writing it frees.
type clientReply struct {
	r     *wire.Reply
	bytes int64
	// goaway: r is the connection's last word (goAway).
	goaway bool
}

func (n *Node) streamConfig() stream.Config {
	cfg := stream.DefaultConfig()
	cfg.Codec = n.cfg.Codec
	return cfg
}

// accept serves the node's TCP connections until the node stops. Each
// goes through the handshakes pool to its hello, within HelloTimeout,
// and then takes a slot of ConnsMax. An Accept that fails (EMFILE: out
// of descriptors) is retried after a backoff: returning would close
// every connection open and leave the node registered, ready and deaf.
func (n *Node) accept(ln net.Listener) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	// Every connection open, by its TCP connection: closed when the node
	// stops.
	conns := map[net.Conn]io.Closer{}
	hs := newHandshakes(n.cfg.HandshakesMax, n.cfg.HandshakesPerSourceMax)
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	go func() {
		<-n.ctx.Done()
		ln.Close()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if n.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
			// Out of descriptors, a connection that said nothing yet
			// gives its own back for the next in the queue.
			if p := hs.evictSilent(); p != nil {
				n.metrics.evicted.Inc()
				p.raw.Close()
				backoff = acceptBackoffMin
			}
			n.metrics.acceptErrors.Inc()
			n.limited.Log(slog.LevelError, "accept", "accept failed: retrying; the connections open are kept", "err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-n.ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		p, evicted := hs.admit(nc, sourceOf(nc.RemoteAddr()))
		if evicted != nil {
			n.metrics.evicted.Inc()
			n.limited.Log(slog.LevelWarn, "handshake-evicted", "connection closed before its hello, for a newer one: too many not yet authenticated",
				"from", evicted.raw.RemoteAddr(), "heard", evicted.heard.Load(), "handshakes_max", hs.max, "per_source_max", hs.perSourceMax)
			evicted.raw.Close()
		}
		mu.Lock()
		conns[nc] = nc
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer hs.leave(p)
			defer func() {
				mu.Lock()
				c := conns[nc]
				delete(conns, nc)
				mu.Unlock()
				c.Close()
			}()
			c, peer, err := n.open(nc, p)
			if err != nil {
				return
			}
			mu.Lock()
			conns[nc] = c
			mu.Unlock()
			n.serve(c, peer, func() bool { return hs.leave(p) })
		}()
	}
}

// open runs an accepted connection's TLS handshake within the hello
// deadline and wraps it for its hello.
func (n *Node) open(raw net.Conn, p *pendingConn) (*stream.Conn, peer, error) {
	cfg := n.streamConfig()
	cfg.StallWindow = 0
	stream.SetKeepAlive(raw, cfg.KeepAlive)
	var nc net.Conn = heardConn{Conn: raw, p: p, tls: n.serverTLS != nil}
	var tc *tls.Conn
	if n.serverTLS != nil {
		tc, nc = stream.Server(nc, n.serverTLS) // records batched: see stream.Client
	}
	hc, err := newHelloConn(nc, n.cfg.HelloTimeout)
	if err != nil {
		return nil, nil, err
	}
	id, err := n.handshake(tc, raw.RemoteAddr())
	if err != nil {
		return nil, nil, err
	}
	// Made only now: a connection that never finishes its handshake
	// costs no stream buffers.
	return stream.NewConn(hc, cfg), id, nil
}

// serve reads the dialer's Hello, checks it against the dialer's
// certificate, takes the connection out of the handshakes pool (authed:
// false if it was closed to make room meanwhile) and into a slot of
// ConnsMax, and hands it on. A nil authed is the node's feed to itself,
// in process (initiator.selfFeed): in no pool, it takes no slot.
func (n *Node) serve(c *stream.Conn, p peer, authed func() bool) {
	refuse := func(format string, args ...any) {
		_ = c.Send(n.ctx, &wire.Reply{Err: wire.ErrText(fmt.Errorf(format, args...))})
	}
	// Nobody is accountable for what comes before the hello is checked:
	// its frame is bounded by the largest hello, not by what the frame
	// header announces.
	c.SetFrameBytesMax(wire.HelloFrameBytesMax)
	m, err := c.Recv()
	if err != nil {
		if errors.Is(err, wire.ErrTooLarge) {
			n.limited.Log(slog.LevelWarn, "hello-too-large", "hello refused: frame too large", "from", c.RemoteAddr(), "peer", p.String(), "err", err)
			refuse("node %s: hello refused: %v", n.id, err)
		}
		return
	}
	h, ok := m.(*wire.Hello)
	if !ok {
		_ = c.Send(n.ctx, &wire.Reply{Err: fmt.Sprintf("expected hello, got %v", m.Type())})
		return
	}
	if err := authorize(p, h); err != nil {
		n.metrics.tlsRefused.Inc()
		n.limited.Log(slog.LevelWarn, refusalKey("hello-refused", err), "hello refused: not what the certificate allows", "from", c.RemoteAddr(), "peer", p.String(), "kind", h.Kind, "err", err)
		refuse("node %s: %v", n.id, err)
		return
	}
	if authed != nil {
		if !authed() {
			return
		}
		client := h.Kind == wire.HelloClient
		ok, open := n.slots.take(client)
		if !ok {
			n.metrics.refused.Inc()
			n.limited.Log(slog.LevelWarn, "conns-max", "connection refused: limit reached", "from", c.RemoteAddr(), "peer", p.String(), "kind", h.Kind,
				"open", open, "conns_max", n.cfg.ConnsMax, "node_conns_reserved", n.cfg.NodeConnsReserved)
			refuse("node %s: connection limit reached (%d open, ConnsMax %d, %d of them kept for nodes): try later or another node", n.id, open, n.cfg.ConnsMax, n.cfg.NodeConnsReserved)
			return
		}
		defer n.slots.release(client)
	}
	c.SetFrameBytesMax(0)
	switch h.Kind {
	case wire.HelloClient:
		if err := c.Send(n.ctx, &wire.Hello{Kind: h.Kind, Node: n.id}); err != nil {
			return
		}
		n.serveClient(c)
	case wire.HelloFeed:
		if h.Initiator == 0 || int(h.Initiator) >= int(txnid.InitiatorsMax) {
			refuse("feed from initiator %d", h.Initiator)
			return
		}
		if h.To != n.incarnation() {
			// The sender's view names another process of this node: an
			// older one, whose feed this is not, or a newer one, which
			// supersedes this one (wire.Hello.To). It dials again once
			// its view names this process.
			refuse("node %s: feed meant for %s's process %d, this is process %d", n.id, n.id, h.To, n.incarnation())
			return
		}
		if err := n.feeds.admitFeed(h); err != nil {
			refuse("%v", err)
			return
		}
		if err := c.Send(n.ctx, &wire.Hello{Kind: h.Kind, Node: n.id}); err != nil {
			return
		}
		n.serveFeed(c, h)
	case wire.HelloRejoin:
		n.serveRejoin(c, h, refuse)
	case wire.HelloRepair:
		if err := c.Send(n.ctx, &wire.Hello{Kind: h.Kind, Node: n.id}); err != nil {
			return
		}
		n.serveRepair(c, h.Node)
	case wire.HelloReach:
		// A process not registered yet checks it reaches this node
		// (reachPeers): the answer is all it needs.
		_ = c.Send(n.ctx, &wire.Hello{Kind: h.Kind, Node: n.id})
	default:
		refuse("unknown hello kind %d", h.Kind)
	}
}

// serveClient answers one client's calls through the initiator. It reads
// the next call only while the connection's calls in flight and replies
// not yet written fit in ClientBytesMax; past it, it stops reading until
// replies drain, and TCP holds the client back (docs/DESIGN.md "Bounds").
func (n *Node) serveClient(c *stream.Conn) {
	n.clientConns.Add(1)
	defer n.clientConns.Add(-1)
	ctx, cancel := context.WithCancel(n.ctx)
	defer cancel()
	b := newClientBudget(n.cfg.ClientBytesMax)
	// Every call admitted has one reply, and the budget admits at most
	// callsMax calls: a send never finds the queue full.
	q := make(chan clientReply, b.callsMax())
	// heard is when the last call came in or reply went out (Unix ns).
	var heard atomic.Int64
	heard.Store(time.Now().UnixNano())
	stop, writerDone, idleDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	wentAway := make(chan struct{}) // the goaway written (goAway)
	go func() {
		defer close(writerDone)
		defer cancel() // a reader waiting for the budget stops too
		writeQueueOf(ctx, c, q, stop, func(r clientReply) wire.Message { return r.r },
			func(r clientReply) {
				b.release(r.bytes)
				heard.Store(time.Now().UnixNano())
				if r.goaway {
					close(wentAway)
				}
			})
	}()
	go func() {
		defer close(idleDone)
		n.closeIdle(ctx, c, b, &heard)
	}()
	defer func() {
		c.Close()
		close(stop)
		<-writerDone
		<-idleDone // the writer cancelled ctx
	}()
	// A graceful stop's goaway stops the reader where it is: a call read
	// part way is not read, and runs nowhere.
	if n.goaway != nil {
		stopRecv := context.AfterFunc(n.goaway, func() { _ = c.SetReadDeadline(time.Unix(1, 0)) })
		defer stopRecv()
	}
	hook := n.cfg.knobs.clientBytes
	calls := 0
	for {
		m, err := c.Recv()
		if err != nil {
			if n.goaway != nil && n.goaway.Err() != nil {
				n.goAway(c, b, q, wentAway)
			}
			return
		}
		heard.Store(time.Now().UnixNano())
		call, ok := m.(*wire.Call)
		if !ok {
			// Nothing is in flight for it: it goes past the budget.
			select {
			case q <- clientReply{r: &wire.Reply{Err: fmt.Sprintf("expected a call, got %v", m.Type())}}:
			default:
			}
			return
		}
		w := callBytes(call)
		used, err := b.acquire(ctx, w)
		if err != nil {
			return
		}
		calls++
		nth := calls
		if hook != nil {
			hook(used, nth)
		}
		req := *call
		req.Params = append([]byte(nil), call.Params...)
		n.sequence(&req, func(r *wire.Reply) {
			rw := replyBytes(r)
			used := b.add(rw)
			if hook != nil {
				hook(used, nth)
			}
			select {
			case q <- clientReply{r: r, bytes: w + rw}:
			default:
				c.Close() // a bug: more replies than calls admitted
			}
		}, false)
	}
}

// closeIdle closes a client's connection once it has had nothing in
// flight and no call or reply for ClientIdleTimeout, until ctx ends: a
// client that keeps connections it does not use holds ConnsMax's slots
// no longer. A call under way, however long, keeps it open.
func (n *Node) closeIdle(ctx context.Context, c *stream.Conn, b *clientBudget, heard *atomic.Int64) {
	d := n.cfg.ClientIdleTimeout
	if d <= 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		quiet := time.Since(time.Unix(0, heard.Load()))
		if quiet < d {
			t.Reset(d - quiet)
			continue
		}
		if !b.idle() {
			t.Reset(d)
			continue
		}
		n.metrics.idleClosed.Inc()
		n.limited.Log(slog.LevelInfo, "client-idle", "client connection closed: idle", "from", c.RemoteAddr(), "idle", quiet.Round(time.Millisecond), "client_idle_timeout", d)
		c.Close()
		return
	}
}

// hello sends h on a dialled connection and waits for the peer's, which
// must name node want, the node the dialer meant to reach: an address
// from etcd may since have been taken by another process. An empty want
// takes any node (a client dialling an address it was given).
func hello(ctx context.Context, c *stream.Conn, h *wire.Hello, want string) error {
	if err := c.Send(ctx, h); err != nil {
		return err
	}
	m, err := c.Recv()
	if err != nil {
		return err
	}
	switch m := m.(type) {
	case *wire.Hello:
		if want != "" && m.Node != want {
			return fmt.Errorf("%v hello answered by node %q, not %q", h.Kind, m.Node, want)
		}
		return nil
	case *wire.Reply:
		return fmt.Errorf("refused: %s", m.Err)
	default:
		return fmt.Errorf("unexpected %v in answer to hello", m.Type())
	}
}
