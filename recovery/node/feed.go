package node

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// feedQueueMax bounds the messages waiting for one feed connection, each
// way. The initiator bounds its txns in flight, so a full queue means the
// peer stopped reading: the feed is then closed, not waited on.
const feedQueueMax = 1 << 16

// ---- the replica node's side: feeds coming in ----

// feedIns are the feeds this node receives, one per initiator.
type feedIns struct {
	n  *Node
	mu sync.Mutex
	by map[txnid.Initiator]*feedIn
	// last is each initiator's latest feed, open or ended: a new feed
	// waits for its tail to be resolved before it is read.
	last map[txnid.Initiator]*feedIn
	// told holds, per node and process (incarnation), what its feeds'
	// hellos said it sequenced without a feed here (wire.Hello.Missed),
	// also of feeds ended since: a process that wrote while this node was
	// away and died before it settled told it all the same. The last
	// toldMax processes of each node.
	told map[string]map[uint64][]uint32
	// holding: the node's registration was lost and is not settled yet,
	// so a replica here may lack txns and must not answer: its results
	// wait in held until settle says which to send and which to drop.
	holding bool
	held    []heldDone
}

type heldDone struct {
	in txnid.Initiator
	d  *wire.Done
}

// heldMax bounds the results held through an outage. Those of its start
// are answers no initiator still waits for (the node was not live for
// it), so past the bound the oldest go.
const heldMax = 1 << 18

// toldMax bounds the processes per node whose Missed a node keeps.
const toldMax = 8

// tellLocked adds what a feed's hello said to told; f.mu held.
func (f *feedIns) tellLocked(node string, inc uint64, missed []uint32) {
	byInc := f.told[node]
	if byInc == nil {
		byInc = map[uint64][]uint32{}
		f.told[node] = byInc
	}
	byInc[inc] = append(byInc[inc], missed...)
	for len(byInc) > toldMax {
		oldest := inc
		for i := range byInc {
			oldest = min(oldest, i)
		}
		delete(byInc, oldest)
	}
}

// hold holds every result from now until release.
func (f *feedIns) hold() {
	f.mu.Lock()
	f.holding = true
	f.mu.Unlock()
}

// release sends the held results of the partitions keep says, drops the
// others (their replicas failed), and stops holding.
func (f *feedIns) release(keep func(p uint32) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, h := range f.held {
		if keep(h.d.Partition) {
			f.sendLocked(h.in, h.d)
		}
	}
	f.held, f.holding = nil, false
}

type feedIn struct {
	in   txnid.Initiator
	node string
	// inc is the sending process's incarnation (its Hello's Epoch).
	inc  uint64
	conn *stream.Conn
	q    chan wire.Message
	// resolved is closed once this feed has ended and its tail is
	// settled on every replica: repaired from the peers and the
	// initiator removed, or the replicas failed.
	resolved chan struct{}
	// redialled is closed when a feed of the same incarnation replaces
	// this one: the initiator lives, so its tail cannot be repaired.
	redialled chan struct{}
	// missed are the partitions whose txns the initiator's process
	// sequenced without a feed to this node before this one opened
	// (wire.Hello.Missed).
	missed []uint32
	// floored: the floor was queued to the initiator. Before it, the
	// initiator sends nothing on the feed, so a redial loses nothing.
	floored atomic.Bool
}

// done sends a txn's result back to its initiator, without waiting.
func (f *feedIns) done(in txnid.Initiator, d *wire.Done) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holding {
		if len(f.held) >= heldMax {
			f.held = f.held[heldMax/2:]
		}
		f.held = append(f.held, heldDone{in, d})
		return
	}
	f.sendLocked(in, d)
}

// sendLocked queues d to its initiator's feed; f.mu held.
func (f *feedIns) sendLocked(in txnid.Initiator, d *wire.Done) {
	fi := f.by[in]
	if fi == nil {
		return // its feed is gone; so is the initiator's wait
	}
	select {
	case fi.q <- d:
	default:
		f.n.log.Warn("feed reply queue full; closing the feed", "initiator", in)
		fi.conn.Close()
	}
}

// admitFeed checks a feed's Hello before it is answered: a process older
// than one already heard from is a leftover and is refused.
func (f *feedIns) admitFeed(h *wire.Hello) error {
	in := txnid.Initiator(h.Initiator)
	f.mu.Lock()
	defer f.mu.Unlock()
	if last := f.last[in]; last != nil && h.Epoch < last.inc {
		return fmt.Errorf("feed from initiator %d of incarnation %d, older than %d already heard", in, h.Epoch, last.inc)
	}
	return nil
}

// serveFeed reads one initiator's feed until it ends.
//
// Each feed is one ordered stream, and a replica's executor tracks one
// sequence per initiator, so the feeds of one initiator are taken in one
// after the other: a new feed is read only once the previous one's tail is
// settled. If the previous feed came from a process that is gone (a lower
// incarnation), its tail is repaired from the peers and the initiator
// removed; the new process then starts a fresh sequence. If it came from
// the same process, that process lived on while this node had no feed
// from it: it stopped waiting for this node's replicas and may have
// committed txns they never got, so they fail and rejoin.
func (n *Node) serveFeed(conn *stream.Conn, h *wire.Hello) {
	in := txnid.Initiator(h.Initiator)
	fi := &feedIn{in: in, node: h.Node, inc: h.Epoch, missed: h.Missed, conn: conn, q: make(chan wire.Message, feedQueueMax),
		resolved: make(chan struct{}), redialled: make(chan struct{})}
	n.feeds.mu.Lock()
	old, prev := n.feeds.by[in], n.feeds.last[in]
	n.feeds.by[in], n.feeds.last[in] = fi, fi
	n.feeds.tellLocked(fi.node, fi.inc, fi.missed)
	n.feeds.mu.Unlock()
	if old != nil {
		old.conn.Close()
	}
	if prev != nil {
		if prev.inc == fi.inc {
			close(prev.redialled)
		}
		select {
		case <-prev.resolved:
		case <-n.ctx.Done():
			close(fi.resolved)
			return
		}
		if prev.inc == fi.inc && prev.floored.Load() {
			why := fmt.Sprintf("feed from initiator %d (%s) re-opened by the same process: txns sent meanwhile were not received", in, h.Node)
			for _, r := range n.replicas {
				r.do(func(r *replica) { r.fail(why) })
			}
		}
	}
	if n.feedSuperseded(fi) {
		// A newer feed replaced this one while it waited: no floor went
		// out on it, so its initiator sent nothing on it.
		conn.Close()
		close(fi.resolved)
		return
	}
	// The floor: once every replica tracks the initiator, none executes
	// past what it has until the initiator speaks, so the highest ID they
	// executed bounds all they ever will without it. The initiator's IDs
	// then start above it (docs/DESIGN.md "An initiator that joins").
	floor := txnid.Zero
	for _, r := range n.replicas {
		if f, ok := ask(r, func(r *replica) txnid.ID {
			r.addInitiator(in, fi.inc)
			return r.executedUpTo()
		}); ok {
			floor = max(floor, f)
		}
	}
	fi.floored.Store(true)
	fi.q <- &wire.Beat{ID: floor}
	writerDone, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(writerDone)
		writeQueue(n.ctx, conn, fi.q, stop)
	}()
	err := n.readFeed(conn)
	conn.Close()
	close(stop)
	<-writerDone
	n.feeds.mu.Lock()
	if n.feeds.by[in] == fi {
		delete(n.feeds.by, in)
	}
	n.feeds.mu.Unlock()
	if n.ctx.Err() != nil {
		close(fi.resolved)
		return
	}
	n.log.Info("feed ended", "initiator", in, "node", h.Node, "err", err)
	n.feedLost(fi)
}

func (n *Node) readFeed(conn *stream.Conn) error {
	for {
		m, err := conn.Recv()
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *wire.Txn:
			r := n.replicas[m.Partition]
			if r == nil {
				continue // not hosted here: the sender's placement is stale
			}
			inv := partition.Invocation{ID: m.ID, Proc: m.Proc, Params: append([]byte(nil), m.Params...)}
			r.do(func(r *replica) { r.onTxn(inv) })
		case *wire.Beat:
			id := m.ID
			for _, r := range n.replicas {
				r.do(func(r *replica) { r.onBeat(id) })
			}
		default:
			return fmt.Errorf("feed: unexpected %v", m.Type())
		}
	}
}

// feedLost: an initiator's feed ended, and with TCP nothing more of it
// can arrive: each replica repairs its tail of that initiator from its
// peers (repair.go) and stops waiting for it, so a killed node stalls the
// others' safe point only as long as its sockets take to close and one
// round trip to each peer. If its process lives on (no feed of a newer
// incarnation follows while its node is alive), the replicas may have
// missed txns it sent: they fail and need a rejoin. The process, not
// the node: a newer process registered under the node's id has taken the
// old one's record, and with it the registration the old one needs to
// sequence a call (supervise.ErrSuperseded), so nothing more comes from
// it and the repair of its tail is complete.
func (n *Node) feedLost(fi *feedIn) {
	ctx, cancel := context.WithCancel(n.ctx)
	go func() {
		select {
		case <-fi.redialled:
			cancel()
		case <-ctx.Done():
		}
	}()
	n.resolveAll(ctx, fi.in, fi.node, fi.inc)
	cancel()
	close(fi.resolved)
	deadline := time.Now().Add(3 * n.cfg.NodeTTL)
	for time.Now().Before(deadline) {
		if !n.members.aliveAs(fi.node, fi.inc) || n.feedSuperseded(fi) {
			return
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-n.ctx.Done():
			return
		}
	}
	if n.feedSuperseded(fi) || !n.members.aliveAs(fi.node, fi.inc) {
		return
	}
	for _, r := range n.replicas {
		r.do(func(r *replica) {
			r.fail(fmt.Sprintf("feed from initiator %d lost while its node %s lives", fi.in, fi.node))
		})
	}
}

// feedSuperseded reports whether a feed newer than fi was opened.
func (n *Node) feedSuperseded(fi *feedIn) bool {
	n.feeds.mu.Lock()
	defer n.feeds.mu.Unlock()
	return n.feeds.last[fi.in] != fi
}

// feedOpenUpTo reports whether a feed from in of incarnation inc or older
// is still open here.
func (n *Node) feedOpenUpTo(in txnid.Initiator, inc uint64) bool {
	n.feeds.mu.Lock()
	defer n.feeds.mu.Unlock()
	f := n.feeds.by[in]
	return f != nil && f.inc <= inc
}

// writeQueue writes q's messages to conn, flushing when q runs dry, until
// the connection fails or ctx ends.
func writeQueue(ctx context.Context, conn *stream.Conn, q <-chan wire.Message, stop <-chan struct{}) {
	writeQueueOf(ctx, conn, q, stop, func(m wire.Message) wire.Message { return m }, nil)
}

// writeQueueOf is writeQueue for queues of T, msg's message each, calling
// wrote (if not nil) once each is written.
func writeQueueOf[T any](ctx context.Context, conn *stream.Conn, q <-chan T, stop <-chan struct{}, msg func(T) wire.Message, wrote func(T)) {
	for {
		var e T
		select {
		case e = <-q:
		case <-ctx.Done():
			conn.Close()
			return
		case <-stop:
			return
		}
		for more := true; more; {
			if err := conn.Write(ctx, msg(e)); err != nil {
				conn.Close()
				return
			}
			if wrote != nil {
				wrote(e)
			}
			select {
			case e = <-q:
			default:
				more = false
			}
		}
		if err := conn.Flush(); err != nil {
			conn.Close()
			return
		}
	}
}

// ---- the initiator: client calls in, feeds out ----

// initiator assigns txn IDs to client calls, sends each to every replica
// of its partition on a live node, heartbeats when idle, and answers the
// client once every live replica has executed the txn.
type initiator struct {
	n *Node

	mu   sync.Mutex
	gen  *txnid.Generator
	outs map[string]*feedOut
	// lost holds, per node, the incarnation (incarnation()) whose feed
	// broke: a call does not wait for a feed to a node that went away.
	lost map[string]int64
	// missed holds, per node, the partitions this process sequenced a txn
	// of while it had no feed to the node: told to it when a feed opens
	// (wire.Hello.Missed). dialing are the nodes a feed is being opened
	// to: no txn of their partitions is sequenced meanwhile.
	missed   map[string]map[uint32]bool
	dialing  map[string]bool
	pending  map[txnid.ID]*call
	lastSend time.Time
}

type feedOut struct {
	node string
	// inc is the node's incarnation (incarnation()) the feed was opened
	// to: the same process across its re-registrations.
	inc    int64
	conn   *stream.Conn
	q      chan wire.Message
	broken chan struct{}
	once   sync.Once
}

func (f *feedOut) close() {
	f.once.Do(func() {
		close(f.broken)
		f.conn.Close()
	})
}

// send queues m; false if the feed is broken or its queue full.
func (f *feedOut) send(m wire.Message) bool {
	select {
	case f.q <- m:
		return true
	case <-f.broken:
		return false
	default:
		f.close()
		return false
	}
}

// call is one client call in flight.
type call struct {
	req     *wire.Call
	id      txnid.ID
	waiting map[string]bool
	// sent: the txn went out on at least one feed, so without a result
	// its outcome is unknown, not a failure.
	sent    bool
	replied bool
	reply   wire.Reply
	send    func(*wire.Reply)
}

func newInitiator(n *Node) (*initiator, error) {
	clock := func() int64 { return time.Now().UnixMilli() }
	if n.cfg.testClock != nil {
		clock = n.cfg.testClock
	}
	gen, err := txnid.NewGenerator(txnid.Initiator(n.cfg.ID), clock)
	if err != nil {
		return nil, err
	}
	return &initiator{n: n, gen: gen, outs: map[string]*feedOut{}, lost: map[string]int64{},
		missed: map[string]map[uint32]bool{}, dialing: map[string]bool{}, pending: map[txnid.ID]*call{}}, nil
}

// submit sequences a call and sends it to its partition's replicas.
func (in *initiator) submit(req *wire.Call, send func(*wire.Reply)) {
	view := in.n.members.view()
	if !in.n.reg.Registered() {
		// Its view may be stale and other nodes may take it for dead: a
		// call sequenced now could miss a replica that went live
		// meanwhile (docs/DESIGN.md "Without the coordinator").
		send(&wire.Reply{Req: req.Req, Err: fmt.Sprintf("node %s is not registered in etcd (coordinator unreachable): it sequences no call until it is", in.n.id)})
		return
	}
	if req.Partition >= in.n.cluster.Partitions {
		send(&wire.Reply{Req: req.Req, Err: fmt.Sprintf("partition %d out of range (%d partitions)", req.Partition, in.n.cluster.Partitions)})
		return
	}
	if !view.bootstrapped {
		// A node of the placement has never started: its replicas will
		// come up live and empty, so nothing may be written before.
		send(&wire.Reply{Req: req.Req, Err: "the cluster is not bootstrapped yet: a node of its placement has never started"})
		return
	}
	view = in.waitFeeds(req.Partition, view)
	in.mu.Lock()
	feeds := in.replicaFeedsLocked(req.Partition, view)
	if unfed := recovery.Unfed(feeds); len(unfed) > 0 {
		// A replica there would never get the txn and, not tracking
		// this initiator, would run past it (docs/DESIGN.md "Feeds that
		// open late"). Nothing was sent: a definite failure.
		in.mu.Unlock()
		send(&wire.Reply{Req: req.Req, Err: fmt.Sprintf("partition %d: no feed open to %s, which holds a replica of it, after %v: the txn was sent nowhere", req.Partition, strings.Join(unfed, ", "), feedWait)})
		return
	}
	c := &call{req: req, waiting: map[string]bool{}, send: send}
	var targets []*feedOut
	for _, rp := range view.placement[req.Partition] {
		f := in.outs[rp.node]
		if f == nil {
			continue
		}
		targets = append(targets, f)
		if rp.live {
			c.waiting[rp.node] = true
		}
	}
	if len(c.waiting) == 0 {
		in.mu.Unlock()
		send(&wire.Reply{Req: req.Req, Err: fmt.Sprintf("partition %d has no live replica", req.Partition)})
		return
	}
	c.id = in.gen.Next()
	in.pending[c.id] = c
	for _, node := range recovery.Missed(feeds) {
		in.noteMissedLocked(node, req.Partition)
	}
	txn := &wire.Txn{Partition: req.Partition, ID: c.id, Proc: req.Proc, Params: req.Params}
	in.n.maybePlant(txn)
	for _, f := range targets {
		if in.n.cfg.testSkip != nil && in.n.cfg.testSkip(f.node, c.id) {
			delete(c.waiting, f.node)
			continue
		}
		if !f.send(txn) {
			delete(c.waiting, f.node)
			in.noteMissedLocked(f.node, req.Partition)
			continue
		}
		c.sent = true
	}
	in.lastSend = time.Now()
	in.maybeReply(c)
	in.mu.Unlock()
}

// feedFloorWait bounds the wait for a feed's floor. The receiver sends it
// once the initiator's previous feed there is settled, which may take a
// tail repair from each peer (up to 3 node TTLs each, repair.go).
const feedFloorWait = time.Minute

// recvFloor reads a feed's first answer: the receiver's floor, the highest
// txn ID its replicas executed before they began to track this initiator.
func recvFloor(ctx context.Context, conn *stream.Conn, wait time.Duration) (txnid.ID, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	for {
		m, err := conn.Recv()
		if ctx.Err() != nil {
			return txnid.Zero, fmt.Errorf("no floor within %s: %w", wait, ctx.Err())
		}
		if err != nil {
			return txnid.Zero, err
		}
		switch m := m.(type) {
		case *wire.Beat:
			return m.ID, nil
		case *wire.Done:
			// A result of a txn of this node's previous process: results
			// go back on the initiator's feed, and the receiver counts
			// this one its feed as soon as its hello is in. Nothing of
			// this process was sent yet, so nothing waits for it.
		default:
			return txnid.Zero, fmt.Errorf("expected the feed's floor, got %v", m.Type())
		}
	}
}

// noteMissedLocked records that node's replica of p lacks a txn this
// process sequenced; in.mu held.
func (in *initiator) noteMissedLocked(node string, p uint32) {
	ps := in.missed[node]
	if ps == nil {
		ps = map[uint32]bool{}
		in.missed[node] = ps
	}
	ps[p] = true
}

// feedWait bounds how long a call waits for the feeds to a partition's
// replicas to open.
const feedWait = 3 * time.Second

// waitFeeds waits, boundedly, until a feed is open to every node of the
// view holding a replica of p (recovery.Unfed), and returns the view
// then. A node that just registered is dialled within a membership poll
// (100 ms); a call in the meantime would have to fail.
func (in *initiator) waitFeeds(p uint32, view *view) *view {
	deadline := time.Now().Add(feedWait)
	for {
		in.mu.Lock()
		missing := len(recovery.Unfed(in.replicaFeedsLocked(p, view))) > 0
		in.mu.Unlock()
		if !missing || !time.Now().Before(deadline) {
			return view
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-in.n.ctx.Done():
			return view
		}
		view = in.n.members.view()
	}
}

// replicaFeedsLocked says, for each replica of p, whether its node is
// alive in v and whether a txn sent now reaches it: the feed to it is
// open, or the one to its process broke (its replicas then fail, having
// tracked this initiator all along). in.mu held.
func (in *initiator) replicaFeedsLocked(p uint32, v *view) []recovery.ReplicaFeed {
	var rs []recovery.ReplicaFeed
	for _, rp := range v.placement[p] {
		rec, alive := v.nodes[rp.node]
		fed := in.outs[rp.node] != nil || alive && in.lost[rp.node] == incarnation(rec)
		rs = append(rs, recovery.ReplicaFeed{Node: rp.node, Alive: alive, Fed: fed, Dialing: in.dialing[rp.node]})
	}
	return rs
}

// onDone records one replica's result.
func (in *initiator) onDone(node string, d *wire.Done) {
	in.mu.Lock()
	defer in.mu.Unlock()
	c := in.pending[d.ID]
	if c == nil || !c.waiting[node] {
		return // a replica not waited for (rejoining), or a late answer
	}
	delete(c.waiting, node)
	if !c.replied {
		c.replied = true
		c.reply.Out = append([]byte(nil), d.Out...)
		c.reply.Err = d.Err
	}
	if c.req.Each {
		c.reply.Each = append(c.reply.Each, wire.ReplicaOut{Node: node, Out: append([]byte(nil), d.Out...), Err: d.Err})
	}
	in.maybeReply(c)
}

// dropNode stops waiting for node: its feed broke.
func (in *initiator) dropNode(node string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.dropNodeLocked(node)
}

// dropNodeLocked stops waiting for node; in.mu held.
func (in *initiator) dropNodeLocked(node string) {
	for _, c := range in.pending {
		if c.waiting[node] {
			delete(c.waiting, node)
			in.maybeReply(c)
		}
	}
}

// dropNotLiveLocked stops waiting for the replicas v no longer has live:
// a replica that failed (needs a rejoin) drops its feed and will not
// answer, though its node lives (e.g. one failed after a lapsed
// registration, docs/DESIGN.md "Without the coordinator"). The call's
// other live replicas hold the txn. in.mu held.
func (in *initiator) dropNotLiveLocked(v *view) {
	for _, c := range in.pending {
		changed := false
		for node := range c.waiting {
			if !slices.ContainsFunc(v.placement[c.req.Partition], func(rp replicaPlace) bool { return rp.node == node && rp.live }) {
				delete(c.waiting, node)
				changed = true
			}
		}
		if changed {
			in.maybeReply(c)
		}
	}
}

// maybeReply answers the client once nothing is waited for; in.mu held.
func (in *initiator) maybeReply(c *call) {
	if len(c.waiting) > 0 {
		return
	}
	delete(in.pending, c.id)
	r := c.reply
	r.Req, r.ID = c.req.Req, c.id
	switch {
	case c.replied:
	case c.sent:
		// Every replica it was sent to was lost before answering: it may
		// have run on some of them. Only the client can decide what to do.
		r.Err, r.Uncertain = "no live replica answered: the txn's outcome is unknown", true
	default:
		r.Err = "the txn reached no live replica"
	}
	c.send(&r)
}

// beat sends a heartbeat on every feed if nothing was sent for a while.
func (in *initiator) beat() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if time.Since(in.lastSend) < in.n.cfg.BeatEvery || len(in.outs) == 0 {
		return
	}
	b := &wire.Beat{ID: in.gen.Next()}
	for _, f := range in.outs {
		if in.n.cfg.testSkip != nil && in.n.cfg.testSkip(f.node, b.ID) {
			continue
		}
		f.send(b)
	}
	in.lastSend = time.Now()
}

// run keeps a feed open to every live node and heartbeats.
func (in *initiator) run() {
	t := time.NewTicker(in.n.cfg.BeatEvery)
	defer t.Stop()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	dialing := map[string]bool{}
	dialed := make(chan string, 64)
	var wg sync.WaitGroup
	defer func() {
		in.mu.Lock()
		for _, f := range in.outs {
			f.close()
		}
		in.mu.Unlock()
		wg.Wait()
	}()
	for {
		select {
		case <-in.n.ctx.Done():
			return
		case <-t.C:
			in.beat()
		case node := <-dialed:
			delete(dialing, node)
		case <-poll.C:
			view := in.n.members.view()
			in.mu.Lock()
			for node, f := range in.outs {
				rec, ok := view.nodes[node]
				switch {
				case !ok:
					// Taken for dead by etcd: stop waiting for it, but keep
					// its feed. A dead process's connection breaks by
					// itself; a process that only lost etcd goes on
					// receiving every txn, so it misses none (docs/DESIGN.md
					// "Without the coordinator").
					in.dropNodeLocked(node)
				case incarnation(rec) != f.inc:
					f.close() // a new process: the old connection is stale
				}
			}
			in.dropNotLiveLocked(view)
			in.mu.Unlock()
			for node, rec := range view.nodes {
				in.mu.Lock()
				_, have := in.outs[node]
				in.mu.Unlock()
				if have || dialing[node] {
					continue
				}
				dialing[node] = true
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { dialed <- node }()
					in.openFeed(node, rec.Address, incarnation(rec))
				}()
			}
		}
	}
}

// openFeed dials node and runs the feed until it breaks.
func (in *initiator) openFeed(node, addr string, inc int64) {
	ctx, cancel := context.WithTimeout(in.n.ctx, 2*time.Second)
	cfg := in.n.dialConfig(node)
	cfg.StallWindow = 0 // a feed may be idle one way; node death is etcd's to tell
	if f := in.n.cfg.testNoFeedTo; f != nil && f(node) {
		cancel()
		return
	}
	// What node missed so far goes in the hello; from here until the
	// feed is open no txn of its partitions is sequenced (Dialing), so
	// the list stays whole.
	in.mu.Lock()
	in.dialing[node] = true
	var missed []uint32
	for p := range in.missed[node] {
		missed = append(missed, p)
	}
	in.mu.Unlock()
	slices.Sort(missed)
	conn, err := stream.Dial(ctx, addr, cfg)
	if err == nil {
		err = hello(ctx, conn, &wire.Hello{Kind: wire.HelloFeed, Node: in.n.id, Initiator: uint16(in.n.cfg.ID), Epoch: in.n.incarnation(), Missed: missed}, node)
		if err != nil {
			conn.Close()
		}
	}
	cancel()
	var floor txnid.ID
	if err == nil {
		if floor, err = recvFloor(in.n.ctx, conn, feedFloorWait); err != nil {
			conn.Close()
		}
	}
	if err != nil {
		in.mu.Lock()
		delete(in.dialing, node)
		in.mu.Unlock()
		if in.n.ctx.Err() == nil {
			in.n.limited.Log(slog.LevelInfo, "feed-dial/"+node, "feed dial failed", "node", node, "err", err)
		}
		return
	}
	f := &feedOut{node: node, inc: inc, conn: conn, q: make(chan wire.Message, feedQueueMax), broken: make(chan struct{})}
	in.mu.Lock()
	delete(in.dialing, node)
	delete(in.missed, node) // the node has the list now
	in.gen.Advance(floor)
	in.outs[node] = f
	// The first message: the replicas' safe point hears from us at once.
	f.send(&wire.Beat{ID: in.gen.Next()})
	in.mu.Unlock()
	in.n.log.Info("feed open", "to", node)
	done := make(chan struct{})
	go func() {
		defer close(done)
		writeQueue(in.n.ctx, conn, f.q, f.broken)
		f.close()
	}()
	for {
		m, err := conn.Recv()
		if err != nil {
			break
		}
		if d, ok := m.(*wire.Done); ok {
			in.onDone(node, d)
		}
	}
	f.close()
	<-done
	in.mu.Lock()
	if in.outs[node] == f {
		delete(in.outs, node)
		in.lost[node] = f.inc
	}
	in.mu.Unlock()
	in.dropNode(node)
	in.n.log.Info("feed closed", "to", node)
}
