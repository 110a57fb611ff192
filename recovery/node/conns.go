package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

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
