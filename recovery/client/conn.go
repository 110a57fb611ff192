package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// node is one allowed node: its address and at most one connection.
type node struct {
	c    *Client
	id   string
	live atomic.Bool // has a record in etcd, as of the last refresh

	// dialSem is held while dialling, so one dial per node runs at once
	// and a waiting caller still honours its context.
	dialSem chan struct{}

	mu       sync.Mutex
	addr     string
	cur      *conn // nil while not connected
	failures int
	retryAt  time.Time
	// stoppingAt is when the node said it is stopping (ErrStopping): the
	// calls go to the others for backoffMax, connected or not.
	stoppingAt time.Time
}

// stopping marks the node as stopping: calls go elsewhere for a while.
func (n *node) stopping() {
	n.mu.Lock()
	n.stoppingAt = time.Now()
	n.mu.Unlock()
}

func (n *node) setAddr(a string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.addr != a {
		n.addr = a
		n.failures, n.retryAt = 0, time.Time{} // a new address: dial at once
	}
}

// backoffUntil reports when the node may be dialled again, if it is
// neither connected nor dialable now, or may be called again, if it said
// it is stopping.
func (n *node) backoffUntil() (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if until := n.stoppingAt.Add(backoffMax); !n.stoppingAt.IsZero() && time.Now().Before(until) {
		return until, true
	}
	if n.cur != nil || n.retryAt.IsZero() || !time.Now().Before(n.retryAt) {
		return time.Time{}, false
	}
	return n.retryAt, true
}

func (n *node) closeConn() {
	n.mu.Lock()
	cur := n.cur
	n.mu.Unlock()
	if cur != nil {
		cur.sc.Close()
	}
}

// get returns the node's connection, dialling it if needed.
func (n *node) get(ctx context.Context) (*conn, error) {
	n.mu.Lock()
	if cur := n.cur; cur != nil {
		n.mu.Unlock()
		return cur, nil
	}
	n.mu.Unlock()
	select {
	case n.dialSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-n.dialSem }()
	n.mu.Lock()
	cur, addr, retryAt := n.cur, n.addr, n.retryAt
	n.mu.Unlock()
	if cur != nil {
		return cur, nil // another caller dialled meanwhile
	}
	if time.Now().Before(retryAt) {
		return nil, fmt.Errorf("node %s: in backoff after failed dials", n.id)
	}
	cn, err := n.dial(ctx, addr)
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.failures++
		d := min(backoffMin<<min(n.failures-1, 10), backoffMax)
		n.retryAt = time.Now().Add(d)
		return nil, err
	}
	if n.c.ctx.Err() != nil { // Close cancels before it closes the nodes
		cn.sc.Close()
		return nil, ErrClosed
	}
	n.failures, n.retryAt = 0, time.Time{}
	n.cur = cn
	n.c.wg.Add(2)
	go cn.read()
	go cn.write()
	return cn, nil
}

// dial connects and exchanges hellos.
func (n *node) dial(ctx context.Context, addr string) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, n.c.opts.DialTimeout)
	defer cancel()
	cfg := n.c.streamCfg
	if n.c.opts.TLS != nil {
		cfg.TLS = n.c.opts.TLS.DialConfig(n.id)
	}
	sc, err := stream.Dial(ctx, addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.id, err)
	}
	// The hello exchange has no deadline of its own: closing the
	// connection when ctx ends unblocks it.
	stop := context.AfterFunc(ctx, func() { sc.Close() })
	defer stop()
	fail := func(err error) (*conn, error) {
		sc.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return nil, fmt.Errorf("node %s at %s: %w", n.id, addr, err)
	}
	if err := sc.Send(ctx, &wire.Hello{Kind: wire.HelloClient}); err != nil {
		return fail(err)
	}
	m, err := sc.Recv()
	if err != nil {
		return fail(err)
	}
	switch m := m.(type) {
	case *wire.Hello:
		if m.Node != "" && m.Node != n.id {
			return fail(fmt.Errorf("%w: answered as node %q", ErrProtocol, m.Node))
		}
	case *wire.Reply:
		return fail(fmt.Errorf("refused: %s", m.Err))
	default:
		return fail(fmt.Errorf("%w: hello answered with %T", ErrProtocol, m))
	}
	if !stop() {
		sc.Close()
		return nil, fmt.Errorf("node %s at %s: hello: %w", n.id, addr, ctx.Err())
	}
	return &conn{
		n:       n,
		sc:      sc,
		slots:   make(chan struct{}, n.c.opts.PipelineMax),
		codec:   cfg.Codec,
		kick:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		pending: make(map[uint64]*pendingCall),
	}, nil
}

// do runs one call on the node. sent reports whether the call may have
// reached the node; a call not sent may go to another node.
func (n *node) do(ctx context.Context, call *wire.Call) (Result, bool, error) {
	cn, err := n.get(ctx)
	if err != nil {
		return Result{}, false, err
	}
	return cn.do(ctx, call)
}

type answer struct {
	res Result
	err error
}

type pendingCall struct {
	proc string
	ch   chan answer // buffered 1
}

// conn is one connection to a node: callers send, one reader receives.
type conn struct {
	n     *node
	sc    *stream.Conn
	slots chan struct{} // in-flight calls
	codec wire.Codec

	// out holds the frames of calls not yet written. A caller appends its
	// frame and, unless a write is under way, writes out itself, and
	// again for the frames that came in meanwhile, at most sendRoundsMax
	// writes; what is left then goes to the writer goroutine (kick). So
	// the calls made during one write share the next: one syscall and
	// one TLS record for many, and no goroutine hop when calls are few.
	// Its callers hold slots, but a caller that gives up frees its slot
	// with its frame still queued, so out is bounded in bytes too
	// (outBytesMax): past it the connection is taken for stuck and fails.
	outMu   sync.Mutex
	enc     wire.FrameEncoder
	out     []byte
	spare   []byte
	writing bool          // a caller or the writer goroutine writes out
	kick    chan struct{} // capacity 1: out is the writer goroutine's
	done    chan struct{} // closed when the connection broke

	mu      sync.Mutex
	nextReq uint64
	pending map[uint64]*pendingCall
	broken  error // set once, when the connection failed
}

func (cn *conn) do(ctx context.Context, call *wire.Call) (Result, bool, error) {
	select {
	case cn.slots <- struct{}{}:
	case <-ctx.Done():
		return Result{}, false, ctx.Err()
	}
	defer func() { <-cn.slots }()
	pc := &pendingCall{proc: call.Proc, ch: make(chan answer, 1)}
	cn.mu.Lock()
	if cn.broken != nil {
		err := cn.broken
		cn.mu.Unlock()
		return Result{}, false, err
	}
	cn.nextReq++
	req := cn.nextReq
	cn.pending[req] = pc
	cn.mu.Unlock()

	m := *call
	m.Req = req
	if err := cn.send(&m); err != nil {
		var enc *encodeError
		if errors.As(err, &enc) {
			// Refused by the encoder: nothing of it was queued.
			cn.mu.Lock()
			delete(cn.pending, req)
			cn.mu.Unlock()
			return Result{}, true, fmt.Errorf("%w: %s on partition %d: %w: nothing was sent", ErrInvalid, call.Proc, call.Partition, enc.err)
		}
		// Part of the frame may have gone out: uncertain. The reader
		// fails the other calls in flight.
		cn.fail(err)
	}
	select {
	case a := <-pc.ch:
		return a.res, true, a.err
	case <-ctx.Done():
		cn.mu.Lock()
		delete(cn.pending, req)
		cn.mu.Unlock()
		// The answer may have raced in.
		select {
		case a := <-pc.ch:
			return a.res, true, a.err
		default:
		}
		return Result{}, true, fmt.Errorf("%w: %s on partition %d via node %s: %w", ErrUncertain, call.Proc, call.Partition, cn.n.id, ctx.Err())
	}
}

// encodeError is a call's frame refused by the encoder (a field over its
// limit): the call was not queued, and the connection is whole.
type encodeError struct{ err error }

func (e *encodeError) Error() string { return e.err.Error() }

// outBytesMax bounds the frames waiting in a connection's out (one frame
// larger than it passes alone): that much unwritten means the node stopped
// reading.
const outBytesMax = 16 << 20

// sendRoundsMax bounds the writes a caller makes for the others' calls
// before it hands the rest to the writer goroutine, so that a caller's
// own call never waits behind a stream of others.
const sendRoundsMax = 2

// send queues m's frame and writes it, with whatever else waits, unless a
// write is under way, which then takes it. An error is the connection's
// (or m's encoding's): the caller fails the connection.
func (cn *conn) send(m *wire.Call) error {
	cn.outMu.Lock()
	at := len(cn.out)
	out, err := cn.enc.AppendFrame(cn.out, m, cn.codec)
	if err != nil {
		cn.outMu.Unlock()
		return &encodeError{err}
	}
	if at > 0 && len(out) > outBytesMax {
		err = fmt.Errorf("%d bytes of calls wait for the connection, limit %d: the node does not read", at, outBytesMax)
	}
	if err != nil {
		cn.out = out[:at]
		cn.outMu.Unlock()
		return err
	}
	cn.out = out
	if cn.writing {
		cn.outMu.Unlock()
		return nil
	}
	cn.writing = true
	return cn.writeOutLocked(sendRoundsMax)
}

// writeOutLocked writes out until it is empty, in at most rounds writes
// (0: no bound), then clears writing; past the bound it leaves writing
// set and kicks the writer goroutine, whose out it now is. Called with
// outMu held; returns with it released.
func (cn *conn) writeOutLocked(rounds int) error {
	for i := 0; ; i++ {
		if len(cn.out) == 0 {
			cn.writing = false
			cn.outMu.Unlock()
			return nil
		}
		if rounds > 0 && i == rounds {
			cn.outMu.Unlock()
			cn.kick <- struct{}{} // never full: only the one writing kicks, once
			return nil
		}
		batch := cn.out
		cn.out = cn.spare[:0]
		cn.outMu.Unlock()
		err := cn.sc.SendFrame(context.Background(), batch)
		cn.outMu.Lock()
		cn.spare = batch[:0]
		if err != nil {
			cn.out, cn.writing = cn.out[:0], false
			cn.outMu.Unlock()
			return err
		}
	}
}

// write is the connection's writer goroutine: it writes what a caller
// handed over (writeOutLocked) until the connection breaks.
func (cn *conn) write() {
	defer cn.n.c.wg.Done()
	for {
		select {
		case <-cn.kick:
			cn.outMu.Lock()
			if err := cn.writeOutLocked(0); err != nil {
				cn.fail(err)
				return
			}
		case <-cn.done:
			return
		}
	}
}

// fail breaks the connection: every call in flight fails with
// ErrUncertain, and the node dials anew on its next call.
func (cn *conn) fail(cause error) {
	cn.end(cause, func(pc *pendingCall, cause error) answer {
		return answer{err: fmt.Errorf("%w: %s via node %s: connection broken: %w", ErrUncertain, pc.proc, cn.n.id, cause)}
	})
}

// goneAway ends the connection on the node's goaway r (wire.Reply): the
// node read no call after the last it answered, so every call in flight
// here ran nowhere and fails as refused, and the caller sends it to
// another node. The node is stopping: calls go elsewhere for a while.
func (cn *conn) goneAway(r *wire.Reply) {
	cn.n.stopping()
	cn.end(fmt.Errorf("%w: %w: %s", ErrRefused, ErrStopping, r.Err), func(pc *pendingCall, _ error) answer {
		return decodeReply(cn.n.id, pc.proc, r)
	})
}

// end breaks the connection with cause, and answers every call in flight
// with answerOf's answer.
func (cn *conn) end(cause error, answerOf func(*pendingCall, error) answer) {
	cn.mu.Lock()
	if cn.broken != nil {
		cn.mu.Unlock()
		return
	}
	if cn.n.c.ctx.Err() != nil {
		cause = fmt.Errorf("%w: %w", ErrClosed, cause)
	}
	cn.broken = fmt.Errorf("node %s: connection broken: %w", cn.n.id, cause)
	close(cn.done)
	pending := cn.pending
	cn.pending = nil
	cn.mu.Unlock()
	cn.sc.Close()
	cn.n.mu.Lock()
	if cn.n.cur == cn {
		cn.n.cur = nil
	}
	cn.n.mu.Unlock()
	for _, pc := range pending {
		pc.ch <- answerOf(pc, cause)
	}
}

// read receives replies until the connection fails.
func (cn *conn) read() {
	defer cn.n.c.wg.Done()
	for {
		m, err := cn.sc.Recv()
		if err != nil {
			cn.fail(err)
			return
		}
		r, ok := m.(*wire.Reply)
		if !ok {
			cn.fail(fmt.Errorf("%w: got %T on a client connection", ErrProtocol, m))
			return
		}
		if r.Req == 0 && r.Refused == wire.RefusedStopping {
			cn.goneAway(r)
			return
		}
		cn.mu.Lock()
		pc := cn.pending[r.Req]
		delete(cn.pending, r.Req)
		cn.mu.Unlock()
		if pc == nil {
			continue // abandoned after its timeout
		}
		pc.ch <- decodeReply(cn.n.id, pc.proc, r)
	}
}

// refusalErr is the client's error for a node's refusal.
func refusalErr(r wire.Refusal) error {
	switch r {
	case wire.RefusedNotRegistered:
		return ErrNotRegistered
	case wire.RefusedNotBootstrapped:
		return ErrNotBootstrapped
	case wire.RefusedNotReady:
		return ErrNotReady
	case wire.RefusedStopping:
		return ErrStopping
	case wire.RefusedNotHolder:
		return ErrNotHolder
	}
	// A refusal of a newer node: nothing was sequenced all the same.
	return fmt.Errorf("refusal %d", uint8(r))
}

// decodeReply copies everything out of r, which is valid only until the
// next Recv.
func decodeReply(nodeID, proc string, r *wire.Reply) answer {
	res := Result{ID: r.ID, Node: nodeID}
	if r.Refused != wire.RefusedNone {
		return answer{res: res, err: fmt.Errorf("%w: %s via node %s: %w: %s", ErrRefused, proc, nodeID, refusalErr(r.Refused), r.Err)}
	}
	if r.Uncertain {
		return answer{res: res, err: fmt.Errorf("%w: %s via node %s: %s", ErrUncertain, proc, nodeID, r.Err)}
	}
	if r.Err != "" {
		// The reply carries the error as text only: a missing row is
		// told by partition.ErrNoRow's text in it.
		if strings.Contains(r.Err, partition.ErrNoRow.Error()) {
			return answer{res: res, err: fmt.Errorf("%w: %w: %s: %s", ErrProcedure, ErrNotFound, proc, r.Err)}
		}
		return answer{res: res, err: fmt.Errorf("%w: %s: %s", ErrProcedure, proc, r.Err)}
	}
	var err error
	if res.Out, err = decodeValues(r.Out); err != nil {
		return answer{res: res, err: fmt.Errorf("%w: %s result: %w", ErrProtocol, proc, err)}
	}
	if len(r.Each) > 0 {
		res.Each = make([]ReplicaResult, len(r.Each))
		for i, e := range r.Each {
			res.Each[i] = ReplicaResult{Node: e.Node, Err: e.Err}
			if e.Err != "" {
				continue
			}
			if res.Each[i].Out, err = decodeValues(e.Out); err != nil {
				res.Each[i].Err = fmt.Sprintf("client: undecodable result: %v", err)
			}
		}
	}
	return answer{res: res}
}

// decodeValues decodes a result tuple into values that own their bytes.
// An empty Out is an empty result.
func decodeValues(b []byte) ([]wire.Value, error) {
	if len(b) == 0 {
		return nil, nil
	}
	vals, n, err := wire.DecodeValues(b, nil)
	if err != nil {
		return nil, err
	}
	if n != len(b) {
		return nil, errors.New("bytes after the result tuple")
	}
	for i := range vals {
		if vals[i].Type == wire.TypeBytes {
			vals[i].Bytes = append([]byte{}, vals[i].Bytes...)
		}
	}
	return vals, nil
}
