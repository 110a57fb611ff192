package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
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

// The bounds of accepted connections (Config.ConnsMax, HelloTimeout,
// ClientBytesMax; docs/DESIGN.md "Bounds").
const (
	// refusingMax bounds the refusals under way at once; past it a
	// connection over ConnsMax is closed without a word.
	refusingMax = 16
	// refuseLinger bounds how long a refusal waits for the dialer to read
	// it and close its end.
	refuseLinger = time.Second
	// refuseDrainBytesMax bounds what a refusal reads of the dialer's input
	// while it waits.
	refuseDrainBytesMax = 64 << 10
	// clientCallOverheadBytes is what a client call in flight costs beyond
	// its bytes: the call, its copy, the initiator's pending entry, the
	// reply and its queue slot. It also bounds the calls in flight per
	// connection to ClientBytesMax / clientCallOverheadBytes + 1.
	clientCallOverheadBytes = 512
)

// helloConn is an accepted connection whose hello is not done yet: reads
// and writes have the hello deadline until the node's first write, which
// is its answer to the hello (a Hello, or a Reply that refuses). The node
// writes nothing before it has read the hello, so one deadline covers
// both the dialer's hello and the node's answer.
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

// refuseConn tells a dialer over ConnsMax why it is refused, as an answer
// to its hello would (a wire.Reply), and closes the connection. It waits,
// boundedly, for the dialer to close first: a close with the dialer's
// hello unread would reset the connection and could lose the reply.
func (n *Node) refuseConn(nc net.Conn, open int) {
	defer nc.Close()
	if err := nc.SetDeadline(time.Now().Add(min(refuseLinger, n.cfg.HelloTimeout))); err != nil {
		return
	}
	if n.serverTLS != nil {
		nc = tls.Server(nc, n.serverTLS) // the handshake goes first, within the deadline
	}
	c := stream.NewConn(nc, stream.Config{Codec: wire.CodecNone})
	text := fmt.Sprintf("node %s: connection limit reached (%d open, ConnsMax %d): try later or another node", n.id, open, n.cfg.ConnsMax)
	if err := c.Send(n.ctx, &wire.Reply{Err: text}); err != nil {
		return
	}
	if err := c.CloseWrite(); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(nc, refuseDrainBytesMax))
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
}

func (n *Node) streamConfig() stream.Config {
	cfg := stream.DefaultConfig()
	cfg.Codec = n.cfg.Codec
	return cfg
}

// accept serves the node's TCP connections until the listener closes: at
// most ConnsMax at once (one more is refused with a reply that says so),
// each given HelloTimeout to say hello and be answered.
func (n *Node) accept(ln net.Listener) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[*stream.Conn]bool{}
	refusing := make(chan struct{}, refusingMax)
	defer func() {
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	go func() {
		<-n.ctx.Done()
		ln.Close()
	}()
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		mu.Lock()
		open := len(conns)
		mu.Unlock()
		if open >= n.cfg.ConnsMax {
			n.metrics.refused.Inc()
			n.limited.Log(slog.LevelWarn, "conns-max", "connection refused: limit reached", "from", nc.RemoteAddr(), "open", open, "conns_max", n.cfg.ConnsMax)
			select {
			case refusing <- struct{}{}:
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-refusing }()
					n.refuseConn(nc, open)
				}()
			default:
				nc.Close() // refusals pile up: no word for this one
			}
			continue
		}
		cfg := n.streamConfig()
		cfg.StallWindow = 0
		stream.SetKeepAlive(nc, cfg.KeepAlive)
		raw := nc
		var tc *tls.Conn
		if n.serverTLS != nil {
			tc, nc = stream.Server(nc, n.serverTLS) // records batched: see stream.Client
		}
		hc, err := newHelloConn(nc, n.cfg.HelloTimeout)
		if err != nil {
			raw.Close()
			continue
		}
		c := stream.NewConn(hc, cfg)
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
			p, err := n.handshake(tc, raw.RemoteAddr())
			if err != nil {
				return
			}
			n.serve(c, p)
		}()
	}
}

// serve reads the dialer's Hello, checks it against the dialer's
// certificate, and hands the connection on.
func (n *Node) serve(c *stream.Conn, p peer) {
	m, err := c.Recv()
	if err != nil {
		return
	}
	h, ok := m.(*wire.Hello)
	if !ok {
		_ = c.Send(n.ctx, &wire.Reply{Err: fmt.Sprintf("expected hello, got %v", m.Type())})
		return
	}
	refuse := func(format string, args ...any) {
		_ = c.Send(n.ctx, &wire.Reply{Err: wire.ErrText(fmt.Errorf(format, args...))})
	}
	if err := authorize(p, h); err != nil {
		n.metrics.tlsRefused.Inc()
		n.limited.Log(slog.LevelWarn, refusalKey("hello-refused", err), "hello refused: not what the certificate allows", "from", c.RemoteAddr(), "peer", p.String(), "kind", h.Kind, "err", err)
		refuse("node %s: %v", n.id, err)
		return
	}
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
	default:
		refuse("unknown hello kind %d", h.Kind)
	}
}

// serveClient answers one client's calls through the initiator. It reads
// the next call only while the connection's calls in flight and replies
// not yet written fit in ClientBytesMax; past it, it stops reading until
// replies drain, and TCP holds the client back (docs/DESIGN.md "Bounds").
func (n *Node) serveClient(c *stream.Conn) {
	ctx, cancel := context.WithCancel(n.ctx)
	defer cancel()
	b := newClientBudget(n.cfg.ClientBytesMax)
	// Every call admitted has one reply, and the budget admits at most
	// callsMax calls: a send never finds the queue full.
	q := make(chan clientReply, b.callsMax())
	stop, writerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(writerDone)
		defer cancel() // a reader waiting for the budget stops too
		writeQueueOf(ctx, c, q, stop, func(r clientReply) wire.Message { return r.r },
			func(r clientReply) { b.release(r.bytes) })
	}()
	defer func() {
		c.Close()
		close(stop)
		<-writerDone
	}()
	hook := n.cfg.knobs.clientBytes
	calls := 0
	for {
		m, err := c.Recv()
		if err != nil {
			return
		}
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
		n.init.submit(&req, func(r *wire.Reply) {
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
		})
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
