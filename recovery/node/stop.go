package node

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// StopMax bounds a node's stop from the moment it is asked to stop: the
// etcd calls its stop makes (attempts reporting their end, claims and
// the registration given up) each have a timeout of their own, and with
// etcd gone they would wait them out in turn. Past StopMax the node
// closes its etcd client, which fails every call still waiting at once,
// and says what it gave up: what etcd holds of it then ends with its
// leases, within their TTLs.
const StopMax = 3 * time.Second

// stopBound is the bound of one node's stop (StopMax).
type stopBound struct {
	log *slog.Logger
	cli *clientv3.Client

	mu       sync.Mutex
	deadline time.Time
	timer    *time.Timer
	// what is the step of the stop under way, named for the log.
	what   string
	gaveUp bool
}

func newStopBound(log *slog.Logger, cli *clientv3.Client) *stopBound {
	return &stopBound{log: log, cli: cli}
}

// begin starts the bound; before it, the node runs.
func (s *stopBound) begin() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		return
	}
	s.deadline = time.Now().Add(StopMax)
	s.what = "the node's admin HTTP and connections"
	s.timer = time.AfterFunc(StopMax, s.onTimeout)
}

// step names the step of the stop under way.
func (s *stopBound) step(what string) {
	s.mu.Lock()
	s.what = what
	s.mu.Unlock()
}

func (s *stopBound) onTimeout() {
	s.mu.Lock()
	s.gaveUp = true
	what := s.what
	s.mu.Unlock()
	s.log.Warn("node stopping: etcd did not answer within the stop's bound; closing the etcd client gives up what still waits on it (what etcd holds of this node ends with its leases)",
		"bound", StopMax, "gave_up", what)
	_ = s.cli.Close()
}

// deregister removes the node's record and revokes its lease, within
// what is left of the bound (the whole of it if the node stopped before
// its stop began, on a lost registration).
func (s *stopBound) deregister(reg *supervise.Node) {
	s.begin()
	s.step("deregistration: the node's record and lease expire by themselves within its TTL")
	s.mu.Lock()
	deadline := s.deadline
	s.mu.Unlock()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := reg.Close(ctx); err != nil {
		s.log.Info("node stopping: deregistration failed; the record and lease expire by themselves within the node's TTL", "err", err)
	}
}

// end stops the bound's timer.
func (s *stopBound) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
	}
}

// CallsDrainMax bounds the graceful part of a stop: the wait for the
// client calls in flight to be answered. Past it the node stops anyway,
// and a call still unanswered is uncertain to its client.
const CallsDrainMax = 5 * time.Second

// callsQuiet is how long no call must have come before a stopping node
// closes its connections: a client that sent a call just before it read
// the first refusal gets that call refused too, not cut off unanswered.
const callsQuiet = 200 * time.Millisecond

// drainCalls is a graceful stop's first part (SIGTERM, or the node's
// context ended): from now on every new client call is refused with
// wire.RefusedStopping, which sends the client to another node with
// nothing sequenced; the calls sequenced already are answered, as the
// node's replicas and feeds run on meanwhile. It returns once none is in
// flight and none came for callsQuiet, at CallsDrainMax, or when ctx ends
// (the registration taken over).
func (n *Node) drainCalls(ctx context.Context) {
	n.stopping.Store(true)
	start := time.Now()
	n.log.Info("node stopping: new calls are refused (their clients go to other nodes); answering the calls in flight",
		"in_flight", n.inCalls.Load(), "bound", CallsDrainMax)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		inFlight := n.inCalls.Load()
		quiet := time.Since(time.Unix(0, n.lastCall.Load())) >= callsQuiet
		switch {
		case inFlight <= 0 && quiet:
			n.log.Info("node stopping: no call in flight", "waited", time.Since(start).Round(time.Millisecond))
			n.goAwayAll(ctx)
			return
		case time.Since(start) >= CallsDrainMax:
			n.log.Warn("node stopping: calls still unanswered at the bound; their clients find them uncertain", "in_flight", inFlight, "bound", CallsDrainMax)
			n.goAwayAll(ctx)
			return
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// goawayMax bounds the last part of a graceful stop: every client
// connection's goaway (goAway) sent, and the client's close read.
const goawayMax = time.Second

// goAwayAll ends drainCalls: every client connection stops reading and
// says so to its client once its calls are answered (goAway). The
// refusals and the quiet drainCalls waits for leave a window all the
// same: a call a client sent as the node closed came to a connection
// closed under it, and was uncertain to the client though it ran nowhere
// (TestGracefulStopUnderLoad, under -race in CI: "upsert via node n4:
// connection broken: stream: recv: EOF"). It returns once every client
// connection has closed, at goawayMax, or when ctx ends.
func (n *Node) goAwayAll(ctx context.Context) {
	if n.goawayNow == nil {
		return
	}
	n.goawayNow()
	start := time.Now()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for n.clientConns.Load() > 0 && time.Since(start) < goawayMax {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
	if left := n.clientConns.Load(); left > 0 {
		n.log.Warn("node stopping: client connections still open at the goaway's bound; a call unanswered on them is uncertain to its client", "open", left, "bound", goawayMax)
	}
}

// goAway is a client connection's end in a graceful stop, its reader
// stopped: once every call it read is answered on the wire, it sends the
// goaway (wire.Reply: a call the client has no answer to ran nowhere),
// closes its sending side, and reads until the client closes its own, as
// a close with input unread sends a reset that may take the goaway with
// it. A call still unanswered at goawayMax, or a connection broken, ends
// it as a stop ended one before: the client finds what it has no answer
// to uncertain.
func (n *Node) goAway(c *stream.Conn, b *clientBudget, q chan<- clientReply, sent <-chan struct{}) {
	deadline := time.Now().Add(goawayMax)
	t := time.NewTimer(goawayMax)
	defer t.Stop()
	for !b.idle() {
		select {
		case <-b.freed:
		case <-t.C:
			return
		}
	}
	bye := &wire.Reply{Refused: wire.RefusedStopping,
		Err: fmt.Sprintf("node %s is stopping: it read no call after the last it answered on this connection, so a call not answered ran nowhere", n.id)}
	select {
	case q <- clientReply{r: bye, goaway: true}:
	default:
		return // not idle after all: a bug, and the close says it
	}
	select {
	case <-sent:
	case <-t.C:
		return
	}
	if c.CloseWrite() != nil {
		return
	}
	_ = c.DiscardUntilEOF(deadline)
}

// watchStop stops the node gracefully when etcd holds a stop request for
// this process (supervise.AskStop, `rejoin drain --stop`), which it takes
// away as it goes; a request for another process of its id is left
// alone. Until the node stops; a watch that ends is made again.
func (n *Node) watchStop() {
	key, want := supervise.StopKey(n.id), strconv.FormatInt(n.started.UnixNano(), 10)
	for n.ctx.Err() == nil {
		resp, err := n.cli.Get(n.ctx, key)
		if err == nil {
			for _, kv := range resp.Kvs {
				if string(kv.Value) == want {
					n.stopAsked(key, want)
					return
				}
			}
			wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(n.ctx))
			for wr := range n.cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1)) {
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypePut && string(ev.Kv.Value) == want {
						cancel()
						n.stopAsked(key, want)
						return
					}
				}
			}
			cancel()
		}
		select {
		case <-time.After(time.Second):
		case <-n.ctx.Done():
		}
	}
}

// stopAsked takes the request away and stops the node.
func (n *Node) stopAsked(key, want string) {
	n.log.Info("node stopping: asked to through etcd (rejoin drain --stop)")
	ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
	defer cancel()
	if _, err := n.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(key), "=", want)).Then(clientv3.OpDelete(key)).Commit(); err != nil {
		n.log.Warn("could not take the stop request away; a later process of this id ignores it", "err", err)
	}
	n.askStop()
}
