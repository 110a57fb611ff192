package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// feedStallWindow is how long a feed may bring nothing before its
// receiver takes it for broken. An initiator heartbeats every idle
// BeatEvery (2 ms), so a feed this quiet comes from a process that is
// stopped or cut off, whose TCP connection may stay open for minutes:
// ending it lets feedLost hold the replicas for the process, or repair
// its tail and run on once the membership takes the process for dead
// (docs/DESIGN.md "Feeds that resume"). A process only slow resumes its
// feed.
const feedStallWindow = time.Second

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
	// toldMax processes of each node. tells numbers the hellos, so that a
	// settlement takes only those of its own outage (outage.tellsFrom).
	told  map[string]map[uint64][]toldHello
	tells uint64
	// gates hold, per initiator, the lock under which its feeds hand what
	// they read to the replicas, and the incarnations taken for dead by
	// an answer (feedGate).
	gates map[txnid.Initiator]*feedGate
	// waiters are the replicas waiting for the next heartbeat.
	waiters beatWaiters
	// holding: the node's registration was lost and is not settled yet,
	// and its lease may have expired since, so a replica here may lack
	// txns and must not answer: its results wait in held until settle
	// says which to send and which to drop. holdAt (Unix nanoseconds; 0:
	// none) is when the lost registration's holding begins (holdFrom).
	holding bool
	holdAt  int64
	held    []heldDone
	// settled are the partitions whose results go out while the others'
	// are held: their replicas here are settled (free).
	settled map[uint32]bool
}

// feedGate is where an initiator's feeds pass what they read to the
// replicas. A repair's answer shuts it for the process it repairs before
// it reads what the replicas hold: from then on nothing of that process
// reaches them, not a txn a feed already had buffered, not a heartbeat
// that would vouch for txns dropped behind it, so the answer is every
// txn of the process this node will ever run.
//
// The gate shuts the feeds there are at the answer, not the process: a
// process taken for dead that comes back is answered wire.Fenced and
// taken in again on a new feed, with its incarnation, whose txns run here
// past the agreed tail (serveFeed).
type feedGate struct {
	mu sync.Mutex
	// deadTo is the highest incarnation taken for dead here; cuts counts
	// the answers. A feed of an incarnation up to deadTo born before the
	// last answer is shut.
	deadTo, cuts uint64
}

// shut reports whether fi's feed is shut; g.mu held.
func (g *feedGate) shut(fi *feedIn) bool { return fi.inc <= g.deadTo && fi.born < g.cuts }

// gateLocked returns in's gate; f.mu held.
func (f *feedIns) gateLocked(in txnid.Initiator) *feedGate {
	g := f.gates[in]
	if g == nil {
		if f.gates == nil {
			f.gates = map[txnid.Initiator]*feedGate{}
		}
		g = &feedGate{}
		f.gates[in] = g
	}
	return g
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

// toldHello is what one feed hello said: the partitions its process
// sequenced txns of without a feed here, and the hello's number in
// feedIns.tells.
type toldHello struct {
	seq    uint64
	missed []uint32
}

// tellLocked adds what a feed's hello said to told; f.mu held.
func (f *feedIns) tellLocked(node string, inc uint64, missed []uint32) {
	byInc := f.told[node]
	if byInc == nil {
		byInc = map[uint64][]toldHello{}
		f.told[node] = byInc
	}
	f.tells++
	byInc[inc] = append(byInc[inc], toldHello{seq: f.tells, missed: missed})
	for len(byInc) > toldMax {
		oldest := inc
		for i := range byInc {
			oldest = min(oldest, i)
		}
		delete(byInc, oldest)
	}
}

// toldSince returns, for each process of each node that sent a hello,
// whether any of its hellos is numbered above from, and what those said
// it missed: what a settlement of the outage that began at from reads.
func (f *feedIns) toldSince(from uint64) map[string]map[uint64]recovery.SettleTold {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]map[uint64]recovery.SettleTold, len(f.told))
	for node, byInc := range f.told {
		out[node] = make(map[uint64]recovery.SettleTold, len(byInc))
		for inc, hellos := range byInc {
			var t recovery.SettleTold
			for _, h := range hellos {
				if h.seq > from {
					t.Since = true
					t.Missed = append(t.Missed, h.missed...)
				}
			}
			out[node][inc] = t
		}
	}
	return out
}

// holdFrom holds every result from at until release.
func (f *feedIns) holdFrom(at time.Time) {
	f.mu.Lock()
	f.holdAt = at.UnixNano()
	f.holding = !time.Now().Before(at)
	f.mu.Unlock()
}

// free sends the held results of ps and passes theirs on from now until
// the next hold: their replicas are settled while others are not.
func (f *feedIns) free(ps []uint32) {
	if len(ps) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.settled == nil {
		f.settled = map[uint32]bool{}
	}
	for _, p := range ps {
		f.settled[p] = true
	}
	kept := f.held[:0]
	for _, h := range f.held {
		if f.settled[h.d.Partition] {
			f.sendLocked(h.in, h.d)
		} else {
			kept = append(kept, h)
		}
	}
	clear(f.held[len(kept):])
	f.held = kept
}

// unsettle holds the results free let out again, from now: the
// registration was lost again before the settlement ended.
func (f *feedIns) unsettle() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.settled) > 0 {
		f.settled = nil
		f.holding = true
	}
}

// freed reports whether p's results go out while a hold goes on (free).
func (f *feedIns) freed(p uint32) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.settled[p]
}

// settling reports whether a lost registration is not settled yet.
func (f *feedIns) settling() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.holding || f.holdAt != 0
}

// forget drops the results held of p: its replica here failed, and what
// it ran may be what no live replica elsewhere will (a txn of this
// process past the tail its peers agreed on, or one run on a state that
// missed txns), so none of it may answer a call. Dropped at the failure,
// not when the settlement frees or releases the partition: by then p may
// have a replica rebuilt since, which stands while the failed one's
// results, held under the same partition, must not go out with its own.
func (f *feedIns) forget(p uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = slices.DeleteFunc(f.held, func(h heldDone) bool { return h.d.Partition == p })
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
	f.held, f.holding, f.holdAt, f.settled = nil, false, 0, nil
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
	// initiator removed, or the replicas failed, or a feed of the same
	// process took it up (docs/DESIGN.md "Feeds that resume").
	resolved chan struct{}
	// redialled is closed when a feed of the same incarnation replaces
	// this one: the initiator lives, and the new feed resumes this one
	// or fails the replicas.
	redialled chan struct{}
	// untracked: the replicas stopped waiting for the initiator (its
	// tail was repaired from the peers, or repairing it failed them).
	// Set before resolved is closed; a feed that comes after cannot
	// resume this one.
	untracked bool
	// floored: the floor was queued to the initiator. Before it, the
	// initiator sends nothing on the feed, so a redial loses nothing.
	floored atomic.Bool
	// beat is the feed's latest heartbeat, which the replicas read when
	// they need it instead of each taking every heartbeat as an event
	// (beatSlot; docs/DESIGN.md "Heartbeats by slot"). A feed that
	// resumes another takes over its slot: the replicas hold it.
	beat *beatSlot
	// recv is the highest txn or heartbeat ID read on the feed (or on
	// the feeds it resumes): where a feed that resumes it starts, and
	// what the receiver acknowledges (wire.FeedAck).
	recv atomic.Uint64
	// gate is the initiator's (feedGate); born is its count of answers
	// when the feed came.
	gate *feedGate
	born uint64
	// fencedAns: the feed was answered wire.Fenced. txns: a txn came on
	// it. Both under gate.mu. A feed answered Fenced that brought no txn
	// stays open to a peer's repair (peerRepairs).
	fencedAns bool
	txns      bool
	// joined are the partitions the initiator joined on this feed, or on
	// the feeds it resumes (wire.Join): their replicas here track it, and
	// so does one created later (trackFeeds). joinMu guards it: the
	// reader writes it, reconcile reads it.
	joinMu sync.Mutex
	joined map[uint32]bool
	// prev is the feed of an earlier process of the initiator whose
	// tail was not settled here when this one came: this feed was read
	// at once, and each partition's join waits for that partition's tail
	// (joinFeed); its own tail is settled only after prev's (feedLost).
	prev *feedIn
	// silentSince (Unix nanoseconds) is when the feed, ended, last
	// brought a frame (its end, or a stall window before a stall), 0
	// before it ended: the node reports a process silent here for
	// suspectAfter (fence.go).
	silentSince atomic.Int64
	// endedAt (Unix nanoseconds) is when the connection ended by a close
	// or a reset, not a stall: 0 otherwise. With the process's record
	// unchanged in etcd meanwhile, the process is reported at once
	// (recordQuiet).
	endedAt atomic.Int64
}

// read records id as read on the feed. The feed's IDs only grow, and
// only its reader stores.
func (fi *feedIn) read(id txnid.ID) { fi.recv.Store(uint64(id)) }

// feedAckEvery is how often at most a feed's receiver acknowledges what
// it read when it has no answer to send with it: the sender's log holds
// about this long of its writes to the node. An acknowledgement of its
// own per txn read doubled the receiver's writes and flushes (closed-loop
// demo: 28k against 33-46k writes/s).
const feedAckEvery = 20 * time.Millisecond

// done sends a txn's result back to its initiator, without waiting.
func (f *feedIns) done(in txnid.Initiator, d *wire.Done) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.holding && f.holdAt != 0 && time.Now().UnixNano() >= f.holdAt {
		f.holding = true
	}
	if f.holding && !f.settled[d.Partition] {
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
// after the other. If the previous feed came from a process that is gone
// (a lower incarnation), its tail is repaired from the peers and the
// initiator removed, replica by replica; the new process starts a fresh
// sequence on each replica once that replica's tail is settled: its feed
// is read at once, and its join of a partition is answered only then
// (joinFeed). If it came from
// the same process, that process lived on while this node had no feed
// from it and kept, in its feed's log, every txn meant for this node
// since: if the replicas here still wait for it and the log reaches down
// to where the old feed stopped, the new feed resumes the old one
// (docs/DESIGN.md "Feeds that resume"). Otherwise its txns meanwhile
// never arrive, so the replicas fail and rejoin.
func (n *Node) serveFeed(conn *stream.Conn, h *wire.Hello) {
	in := txnid.Initiator(h.Initiator)
	fi := &feedIn{in: in, node: h.Node, inc: h.Epoch, conn: conn, q: make(chan wire.Message, feedQueueMax),
		resolved: make(chan struct{}), redialled: make(chan struct{}), beat: &beatSlot{}}
	n.feeds.mu.Lock()
	old, prev := n.feeds.by[in], n.feeds.last[in]
	n.feeds.by[in], n.feeds.last[in] = fi, fi
	fi.gate = n.feeds.gateLocked(in)
	fi.gate.mu.Lock()
	fi.born = fi.gate.cuts
	fi.gate.mu.Unlock()
	n.feeds.tellLocked(fi.node, fi.inc, h.Missed)
	n.feeds.mu.Unlock()
	if old != nil {
		old.conn.Close()
	}
	resumed, fenced, afresh, early := false, false, false, false
	if prev != nil && prev.inc < fi.inc {
		// A new process: its feed is read at once, and each partition's
		// join waits for the old process's tail there (joinFeed). Read
		// only once the old tail was settled on every replica, a
		// restarted node's feeds waited for the repair of partitions
		// whose peers were unreachable, and it could sequence nothing
		// meanwhile, in partitions whose tail was settled long before
		// too (rejoin chaos --seed 406596625, 3m, +145.56 s: partition
		// 6 went 0.84 s without a successful op).
		select {
		case <-prev.resolved:
		default:
			fi.prev = prev
		}
	} else if prev != nil {
		if prev.inc == fi.inc {
			close(prev.redialled)
			early = n.fencedEarly(conn, prev, h)
		}
		select {
		case <-prev.resolved:
		case <-n.ctx.Done():
			close(fi.resolved)
			return
		}
		if early && !prev.untracked {
			// Taken for dead here and yet not settled so: nothing to
			// tell the process but what it was told. It dials again.
			n.log.Warn("feed of a process told it was taken for dead, whose tail here did not end untracked: closed", "initiator", in, "node", h.Node)
			conn.Close()
			close(fi.resolved)
			return
		}
		if prev.inc == fi.inc && prev.floored.Load() {
			var why string
			switch at := txnid.ID(prev.recv.Load()); {
			case prev.untracked, prev.fencedAns && at == txnid.Zero:
				// Taken for dead: the replicas here and their peers agreed
				// on where its txns end and ran on. They stand; the
				// process's own replicas do not (wire.Fenced). So again if
				// the last answer said so and nothing came after it: the
				// process may not have got it.
				fenced = true
			case !h.Resume && at == txnid.Zero:
				afresh = true
				// Nothing came on the last feed: the process did not get
				// its floor (the connection broke first), so it never took
				// the feed for open and sent nothing on it, and dials
				// afresh. A reset between hello and floor failed every
				// replica here ("re-opened by the same process without
				// resuming", rejoin chaos --net-faults on).
			case !h.Resume:
				why = fmt.Sprintf("feed from initiator %d (%s) re-opened by the same process without resuming: txns sent meanwhile were not received", in, h.Node)
			case at < h.Kept:
				why = fmt.Sprintf("feed from initiator %d (%s) re-opened by the same process, which no longer holds what this node missed (it stopped at %v, the sender keeps above %v)", in, h.Node, at, h.Kept)
			default:
				resumed = true
				fi.beat = prev.beat
				fi.recv.Store(uint64(at))
				fi.joined = prev.joinedSet()
			}
			if !resumed && !fenced && !afresh {
				for _, r := range n.hosted() {
					r.do(func(r *replica) { r.lose(why) })
				}
			}
		}
	}
	if !resumed && !fenced && n.members.fencedAs(fi.node, fi.inc) {
		// The cluster fenced the process: it is dead here whether or
		// not a feed of it came before. Its feed counts in its gate
		// (mayRegister) only if answered so or opened since its term
		// ended, and one dialled while it was cut off and healed at
		// once opens before the process sees its term end: answered
		// with a plain floor, as a new process is, it counted for
		// nothing, stayed open, and the process never registered again
		// (TestFencedHealedAtOnceRegisters).
		fenced = true
	}
	if n.feedSuperseded(fi) {
		// A newer feed replaced this one while it waited: no floor went
		// out on it, so its initiator sent nothing on it.
		conn.Close()
		close(fi.resolved)
		return
	}
	if resumed {
		// The replicas still track the initiator at the slot they had,
		// and what it sent meanwhile comes next on this feed. A
		// partition it names as missed had txns it sent nowhere while
		// this node was out of its view: those replicas lack them.
		for _, p := range h.Missed {
			if r := n.hosted()[p]; r != nil {
				why := fmt.Sprintf("initiator %d (%s) sequenced txns of partition %d while this node was out of its view", in, h.Node, p)
				r.do(func(r *replica) { r.lose(why) })
			}
		}
		// A replica created while the feed was broken (trackFeeds saw no
		// open feed of the initiator) tracks it from here, before any
		// txn of the new feed reaches it, if the initiator joined its
		// partition; the others track it already, at the same slot, and
		// this changes nothing for them.
		for p, r := range n.hosted() {
			if fi.joined[p] {
				r.do(func(r *replica) { r.addInitiator(in, fi.inc, fi.beat) })
			}
		}
		n.log.Info("feed resumed", "initiator", in, "node", h.Node, "at", txnid.ID(fi.recv.Load()))
		fi.floored.Store(true)
		fi.q <- &wire.FeedAck{ID: txnid.ID(fi.recv.Load())}
	} else {
		if fenced {
			fi.gate.mu.Lock()
			fi.fencedAns = true
			fi.gate.mu.Unlock()
			if !early {
				ps := n.livePartitions()
				n.log.Warn("feed of a process taken for dead here: its replicas of the partitions live here must rejoin", "initiator", in, "node", h.Node, "partitions", len(ps))
				fi.q <- &wire.Fenced{Partitions: ps}
			}
		}
		// The floor: the highest ID the replicas here executed or read
		// as safe. No replica tracks the initiator yet: it joins each
		// partition it sequences (joinFeed), and each join answers the
		// partition's own floor (docs/DESIGN.md "Sequencers per
		// partition"). This one only starts its IDs above what ran here.
		floor := txnid.Zero
		for _, r := range n.hosted() {
			if f, ok := ask(r, func(r *replica) txnid.ID { return r.joinFloor(in) }); ok {
				floor = max(floor, f)
			}
		}
		fi.floored.Store(true)
		fi.q <- &wire.Beat{ID: floor}
	}
	writerDone, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(writerDone)
		writeFeedIn(n.ctx, conn, fi, stop)
	}()
	err := n.readFeed(conn, fi)
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
	silent := time.Now()
	if errors.Is(err, stream.ErrStalled) {
		silent = silent.Add(-n.feedStall())
	} else {
		fi.endedAt.Store(silent.UnixNano())
	}
	fi.silentSince.Store(silent.UnixNano())
	n.feedLost(fi)
}

// feedStall is a peer's feed's stall window here.
func (n *Node) feedStall() time.Duration { return max(feedStallWindow, 100*n.cfg.BeatEvery) }

// readFeed reads fi's feed: each txn goes into its replica's inbox, in
// feed order; a heartbeat only raises the feed's slot and wakes the
// replicas waiting for one, so it costs nothing to a replica with nothing
// to run (docs/DESIGN.md "Heartbeats by slot"). The order matters: a txn
// is enqueued before the slot is raised past it (beatSlot's invariant).
func (n *Node) readFeed(conn *stream.Conn, fi *feedIn) error {
	if fi.node != n.id {
		// The feed of this node's own initiator is a pipe in the
		// process: its silence says only that the process was slow.
		conn.SetStallWindow(n.feedStall())
	}
	for {
		m, err := conn.Recv()
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *wire.Join:
			err = n.joinFeed(fi, m.Partition)
		case *wire.Call:
			n.serveForward(fi, m)
		default:
			err = n.takeFeedMsg(fi, m)
		}
		if err != nil {
			return err
		}
	}
}

// joinFeed takes the initiator's join of p on fi: the replica of p here
// tracks it from now on (none did before), and the answer carries the
// partition's floor (docs/DESIGN.md "Sequencers per partition"). The
// reader waits for the replica, so the txns of p that follow on the feed
// find the initiator tracked. A join asked again (a resumed feed's)
// changes nothing and is answered again. Outside the gate: a join adds
// no txn, and if the process is taken for dead meanwhile, its feed's end
// removes it from every replica after this returns (feedLost).
func (n *Node) joinFeed(fi *feedIn, p uint32) error {
	if p >= n.cluster.Partitions {
		return fmt.Errorf("feed: initiator %d joined partition %d of %d", fi.in, p, n.cluster.Partitions)
	}
	if n.gaveTail(fi) {
		return fi.shutErr()
	}
	fi.joinMu.Lock()
	if fi.joined == nil {
		fi.joined = map[uint32]bool{}
	}
	fi.joined[p] = true
	fi.joinMu.Unlock()
	floor := txnid.Zero
	if r := n.hosted()[p]; r != nil {
		var joined bool
		floor, joined = n.joinReplica(fi, r)
		if !joined {
			n.joinAfterTail(fi, p, r)
			return nil
		}
	}
	select {
	case fi.q <- &wire.Joined{Partition: p, Floor: floor}:
		return nil
	default:
		return fmt.Errorf("feed: initiator %d's answer queue is full", fi.in)
	}
}

// joinReplica makes r track fi's initiator and returns r's part of the
// join's floor, unless r still tracks an earlier process of it, whose
// tail here is not settled yet (fi.prev): then joined is false.
func (n *Node) joinReplica(fi *feedIn, r *replica) (floor txnid.ID, joined bool) {
	type answer struct {
		floor  txnid.ID
		joined bool
	}
	a, ok := ask(r, func(r *replica) answer {
		if fi.prev != nil && r.core.Tracks(fi.in) && r.incOf[fi.in] < fi.inc {
			return answer{}
		}
		r.addInitiator(fi.in, fi.inc, fi.beat)
		return answer{r.joinFloor(fi.in), true}
	})
	return a.floor, a.joined || !ok
}

// joinTailPoll is how often a join waiting for an earlier process's tail
// looks again (joinAfterTail).
const joinTailPoll = 10 * time.Millisecond

// joinAfterTail answers fi's join of p once r no longer tracks the
// earlier process of fi's initiator: its tail of p is settled, repaired
// from the peers (feedLost). The feed's other partitions go on
// meanwhile. It gives up when the feed ends.
func (n *Node) joinAfterTail(fi *feedIn, p uint32, r *replica) {
	n.goRun(func() {
		t := time.NewTicker(joinTailPoll)
		defer t.Stop()
		for {
			select {
			case <-n.ctx.Done():
				return
			case <-t.C:
			}
			n.feeds.mu.Lock()
			current := n.feeds.by[fi.in] == fi
			n.feeds.mu.Unlock()
			if !current {
				return // the feed ended: its initiator joins again on the next
			}
			floor, joined := n.joinReplica(fi, r)
			if !joined {
				continue
			}
			select {
			case fi.q <- &wire.Joined{Partition: p, Floor: floor}:
			default:
				fi.conn.Close() // as for a full answer queue at the reader
			}
			return
		}
	})
}

// serveForward sequences a call that fi's node forwarded here, as it
// holds no replica of the call's partition, and sends the answer back on
// the feed. One that must wait for feeds here does not hold the feed's
// reader, whose txns would wait with it (sequence).
func (n *Node) serveForward(fi *feedIn, m *wire.Call) {
	call := *m
	call.Params = slices.Clone(m.Params)
	answer := func(r *wire.Reply) {
		a := *r
		a.Req = call.Req
		select {
		case fi.q <- &a:
		default:
			fi.conn.Close() // its forwards end as of unknown outcome there
		}
	}
	n.sequence(&call, answer, true)
}

// shutErr is what ends fi's feed once its gate shut it.
func (fi *feedIn) shutErr() error {
	return fmt.Errorf("feed: initiator %d's process (%s) is taken for dead here: a peer's repair got its tail from here", fi.in, fi.node)
}

// joinedSet returns a copy of the partitions joined on fi.
func (fi *feedIn) joinedSet() map[uint32]bool {
	fi.joinMu.Lock()
	defer fi.joinMu.Unlock()
	return maps.Clone(fi.joined)
}

// hasJoined reports whether the initiator joined p on fi.
func (fi *feedIn) hasJoined(p uint32) bool {
	fi.joinMu.Lock()
	defer fi.joinMu.Unlock()
	return fi.joined[p]
}

// takeFeedMsg passes one message of fi's feed on, through the
// initiator's gate.
func (n *Node) takeFeedMsg(fi *feedIn, m wire.Message) error {
	fi.gate.mu.Lock()
	defer fi.gate.mu.Unlock()
	if fi.gate.shut(fi) {
		return fi.shutErr()
	}
	switch m := m.(type) {
	case *wire.Txn:
		// The certificate allowed the feed as one initiator only
		// (authorize): a txn of another would be ordered, acknowledged
		// and repaired as that initiator's.
		if m.ID.Initiator() != fi.in {
			return fmt.Errorf("feed: txn %v of initiator %d on the feed of initiator %d", m.ID, m.ID.Initiator(), fi.in)
		}
		fi.read(m.ID)
		fi.txns = true
		r := n.hosted()[m.Partition]
		if r == nil {
			return nil // not hosted here: the sender's placement is stale
		}
		r.do(txnEvent(partition.Invocation{ID: m.ID, Proc: m.Proc, Params: append([]byte(nil), m.Params...)}))
	case *wire.Beat:
		if m.ID.Initiator() != fi.in {
			return fmt.Errorf("feed: heartbeat %v on the feed of initiator %d", m.ID, fi.in)
		}
		fi.read(m.ID)
		fi.beat.raise(m.ID)
		n.feeds.waiters.wake()
	case *wire.BeatAsk:
		n.init.beatPast(m.ID)
	default:
		return fmt.Errorf("feed: unexpected %v", m.Type())
	}
	return nil
}

// txnEvent is a txn of a feed as its replica's event, with the time it
// was read: a source's pacer measures its wait (pace.go).
func txnEvent(inv partition.Invocation) event {
	t := time.Now()
	return func(r *replica) { r.onTxnAt(inv, t) }
}

// feedLost: an initiator's feed ended. While its process lives (its
// node alive in the membership with the feed's incarnation, and no feed
// of another process since), the replicas go on waiting for it: a broken
// connection is not a dead initiator, and the process keeps in its feed's
// log every txn meant for this node until a new feed of it resumes this
// one (docs/DESIGN.md "Feeds that resume"). Stopping to wait for a live
// initiator would let the replicas run past txns it sent, or will send,
// that they never get. Once the process is gone (the membership lost it,
// or a newer process of the node opened a feed), nothing more comes from
// it: each replica repairs its tail of that initiator from its peers
// (repair.go) and stops waiting for it. The process, not the node: a
// newer process registered under the node's id has taken the old one's
// record, and with it the registration the old one needs to sequence a
// call (supervise.ErrSuperseded), so the repair of its tail is complete.
//
// A killed node therefore stalls the replicas that track it until its
// lease ends or it restarts, not only until its sockets close.
func (n *Node) feedLost(fi *feedIn) {
	defer close(fi.resolved)
	if fi.prev != nil {
		// The earlier process's tail first: both repairs would remove
		// the same initiator from the same replicas.
		select {
		case <-fi.prev.resolved:
		case <-n.ctx.Done():
			return
		}
	}
	self := fi.node == n.id && fi.inc == uint64(n.incarnation())
	for {
		for self || !n.takenForDead(fi) {
			// This node's own process is never taken for dead here: its
			// feed to itself ends only with the process.
			select {
			case <-fi.redialled:
				// Unless a peer got this process's tail from here to stop
				// waiting for it (the loop ends, and the process is taken
				// for dead here too, whatever this node's view says yet),
				// the new feed resumes this one, or fails the replicas.
				if self || !n.gaveTail(fi) {
					return
				}
			case <-time.After(50 * time.Millisecond):
			case <-n.ctx.Done():
				return
			}
		}
		if n.comesBack(fi) {
			return
		}
		// Taken for dead: repair. A process that comes back before the
		// repair's first request went out (its node alive as that process
		// again, or a redial of it) cuts it short, and the replicas go on
		// waiting for it, unless a peer got its tail from here: then it is
		// dead here too. Once a request went out, the peer asked takes the
		// process for dead, and the repair runs to its end (tailRun). What
		// the survivors agree on stands, and a feed of the process that
		// comes after learns it was fenced.
		n.log.Info("initiator's process taken for dead: repairing its tail from the peers", "initiator", fi.in, "node", fi.node)
		run := newTailRun(n.ctx)
		watchDone := make(chan struct{})
		go func() {
			defer close(watchDone)
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			redialled := fi.redialled
			for !run.isCommitted() {
				select {
				case <-run.ctx.Done():
					return
				case <-t.C:
				case <-redialled:
					redialled = nil // closed: the ticker checks from here
				}
				if (n.comesBack(fi) || n.livesFor(fi)) && run.cutShort() {
					return
				}
			}
		}()
		done := n.resolveAll(run, fi.in, fi.node, fi.inc)
		run.cancel()
		<-watchDone
		if done {
			fi.untracked = true
			return
		}
		if n.ctx.Err() != nil || n.comesBack(fi) {
			return
		}
		n.log.Info("initiator's process back before its tail was repaired: the replicas go on waiting for it", "initiator", fi.in, "node", fi.node)
	}
}

// livesFor reports whether fi's process lives as far as this node can
// tell: its node alive as that process, no newer process's feed here,
// and no peer given its tail for a repair (a repair under way is cut
// short while it does).
func (n *Node) livesFor(fi *feedIn) bool {
	return n.members.aliveAs(fi.node, fi.inc) && !n.feedSuperseded(fi) && !n.gaveTail(fi)
}

// takenForDead reports whether this node takes fi's process for dead
// (feedLost holds until it does): a peer got its tail from here, or a
// newer process of its node registered or fed this node, or the node has
// been gone from the membership for deadGrace while this node held its
// own registration (deadFor).
func (n *Node) takenForDead(fi *feedIn) bool {
	if n.gaveTail(fi) {
		return true
	}
	if rec, ok := n.members.view().nodes[fi.node]; ok {
		// A record older than the feed's process is a view that lags
		// its restart.
		return uint64(incarnation(rec)) > fi.inc
	}
	n.feeds.mu.Lock()
	last := n.feeds.last[fi.in]
	n.feeds.mu.Unlock()
	return (last != nil && last.inc > fi.inc) || n.deadFor(fi.node)
}

// deadFor reports whether node, gone from the membership, is dead as far
// as this node may say: it has been gone for deadGrace, and this node
// holds its own registration, settled. A record gone for a moment is not
// a dead process: when etcd stops for longer than a lease, every lease
// ends at once and every process registers again within milliseconds,
// and a node that took the others for dead then (as they took it) had
// them fence each other over the same partitions and fail every replica
// of them (chaos seed 690063411, an etcd pause in a network fault). A
// node without its registration sees a view frozen at its last read.
func (n *Node) deadFor(node string) bool {
	d, gone := n.members.goneFor(node)
	return gone && (d >= n.deadGrace() || n.members.fenced(node)) && n.registeredSettled()
}

// deadGrace is how long a node must stay gone from the membership before
// its process is taken for dead: a quarter of the node TTL.
func (n *Node) deadGrace() time.Duration { return n.cfg.NodeTTL / 4 }

// registeredSettled reports whether the node holds its registration and
// settled the lapse before it, if any. A node built without one (a unit
// test's) counts as registered.
func (n *Node) registeredSettled() bool {
	if n.reg == nil {
		return true
	}
	return n.reg.Registered() && int64(n.reg.Term().Seq) == n.settledTerm.Load()
}

// comesBack reports whether a feed of fi's process replaced it and this
// node may let that feed resume it: no peer got the process's tail from
// here for a repair.
func (n *Node) comesBack(fi *feedIn) bool {
	select {
	case <-fi.redialled:
		return !n.gaveTail(fi)
	default:
		return false
	}
}

// livePartitions lists, in increasing order, the partitions of the
// replicas here that are live.
func (n *Node) livePartitions() []uint32 {
	var ps []uint32
	for p, r := range n.hosted() {
		if live, ok := ask(r, func(r *replica) bool { return r.core.State() == recovery.ReplicaLive }); ok && live {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// feedSuperseded reports whether a feed newer than fi was opened.
func (n *Node) feedSuperseded(fi *feedIn) bool {
	n.feeds.mu.Lock()
	defer n.feeds.mu.Unlock()
	return n.feeds.last[fi.in] != fi
}

// answerRepair takes in's incarnation inc for dead here, as the peer
// whose repair asks took it (its membership lost the process): it shuts
// the gate on every feed of the process there is, so nothing more of it
// reaches the replicas and a feed that would resume one of them takes
// the process for dead instead (feedLost, gaveTail); and it closes the
// process's feed if one is open here, which feedLost then repairs as
// this node's own. A peer that asked while this node was still fed used
// to be refused until the feed ended, and failed its replicas after its
// retries: a process cut off from etcd and from some of its peers, but
// not from all, failed every replica of the peers it no longer reached.
func (n *Node) answerRepair(in txnid.Initiator, inc uint64) {
	n.feeds.mu.Lock()
	g, open := n.feeds.gateLocked(in), n.feeds.by[in]
	n.feeds.mu.Unlock()
	g.mu.Lock()
	g.deadTo = max(g.deadTo, inc)
	g.cuts++
	g.mu.Unlock()
	if open != nil && open.inc <= inc {
		n.log.Info("feed of a process a peer took for dead closed: its tail goes to the peer's repair", "initiator", in, "node", open.node)
		open.conn.Close()
	}
}

// fencedEarly tells the process of h, redialling here, at once that it
// was taken for dead (wire.Fenced, ahead of the floor), if it was for
// good (a fence or a peer's repair shut prev, its last feed here) and
// prev's tail is not settled yet. Its floor waits for that, and the
// repair may wait for a live peer cut off, until that peer is fenced;
// the fenced process registers again only once a majority answered it,
// and its report may be the one missing to fence that peer. Told only
// with the floor, a node fenced and then back on the larger side of a
// split waited for the heal (rejoin chaos --net-faults on --seed
// 697575384: n4 fenced, then {n1,n2}|{n3,n4,n5}, 12.4 s unregistered).
// It reports whether it told.
func (n *Node) fencedEarly(conn *stream.Conn, prev *feedIn, h *wire.Hello) bool {
	select {
	case <-prev.resolved:
		return false
	default:
	}
	if !n.gaveTail(prev) {
		return false
	}
	ps := n.livePartitions()
	if err := conn.Send(n.ctx, &wire.Fenced{Partitions: ps}); err != nil {
		return false
	}
	n.log.Warn("feed of a process taken for dead here, its tail still under repair: told at once; its replicas of the partitions live here must rejoin", "initiator", prev.in, "node", h.Node, "partitions", len(ps))
	return true
}

// peerRepairs is answerRepair for a peer's repair of in's process inc,
// but for a feed of that process open here that was answered wire.Fenced
// (taken in after the process was taken for dead here), has brought no
// txn, and whose process is not registered: that feed carries nothing
// of the life the peer repairs, which ended here before it came, and
// its process cannot sequence a txn on it (it is not registered), so
// the answer is final without closing it. Closed, the fenced process's
// feeds never stayed open: a repair begun before its fence, answered
// after the heal, closed the feed it had just opened at one peer; that
// peer repaired in turn and closed it at the others, round and round,
// and the process, which registers only with feeds open to a majority,
// stayed out for good (TestFencedNodeBackOnTheMajoritySide, one run in
// five under -race).
func (n *Node) peerRepairs(in txnid.Initiator, inc uint64) {
	n.feeds.mu.Lock()
	g, open := n.feeds.gateLocked(in), n.feeds.by[in]
	n.feeds.mu.Unlock()
	if open != nil && open.inc == inc && !n.members.aliveAs(open.node, open.inc) {
		g.mu.Lock()
		keep := open.fencedAns && !open.txns && !g.shut(open)
		g.mu.Unlock()
		if keep {
			n.limited.Log(slog.LevelInfo, fmt.Sprintf("keep-feed/%d", in), "a peer repairs the tail of a process taken for dead here before its open feed came: the feed stays open", "initiator", in, "node", open.node)
			return
		}
	}
	n.answerRepair(in, inc)
}

// gaveTail reports whether this node gave a peer's repair the tail of
// fi's process since fi came (its gate shut it). A process fenced and
// taken in again on a later feed is not taken for dead for an answer
// that came before: that feed's own break holds and resumes like any
// other. (Kept per process instead, a reset of the later feed had the
// process taken for dead here at once, though it lived.)
func (n *Node) gaveTail(fi *feedIn) bool {
	fi.gate.mu.Lock()
	defer fi.gate.mu.Unlock()
	return fi.gate.shut(fi)
}

// writeFeedIn writes a feed's answers (its floor, the Dones) from fi.q,
// and with each flush a FeedAck of what the feed read, if it moved; a
// feed with no answers to send acknowledges every feedAckEvery.
func writeFeedIn(ctx context.Context, conn *stream.Conn, fi *feedIn, stop <-chan struct{}) {
	acked := txnid.ID(fi.recv.Load()) // a resumed feed's first answer says it
	ack := func() error {
		at := txnid.ID(fi.recv.Load())
		if at <= acked {
			return nil
		}
		acked = at
		return conn.Write(ctx, &wire.FeedAck{ID: at})
	}
	tick := time.NewTicker(feedAckEvery)
	defer tick.Stop()
	for {
		var m wire.Message
		select {
		case m = <-fi.q:
		case <-tick.C:
			if txnid.ID(fi.recv.Load()) <= acked {
				continue
			}
		case <-ctx.Done():
			conn.Close()
			return
		case <-stop:
			return
		}
		for m != nil {
			if err := conn.Write(ctx, m); err != nil {
				conn.Close()
				return
			}
			select {
			case m = <-fi.q:
			default:
				m = nil
			}
		}
		if err := ack(); err != nil {
			conn.Close()
			return
		}
		if err := conn.Flush(); err != nil {
			conn.Close()
			return
		}
	}
}

// writeQueue writes q's messages to conn, flushing when q runs dry, until
// the connection fails or ctx ends. The BeatAsks of one burst go out as
// one, the highest, written last before the flush: an ask orders nothing
// on the feed, and the highest answers them all. Of Beats queued one after
// another with nothing between them only the last goes out: each is its
// initiator's promise to send nothing below it, and they grow, so the
// last says all the others do (heartbeats answering asks pile up so when
// the writer waits for a CPU).
func writeQueue(ctx context.Context, conn *stream.Conn, q <-chan wire.Message, stop <-chan struct{}) {
	var ask wire.BeatAsk
	var beat wire.Message // a Beat held back until the next message shows whether it is needed
	for {
		var m wire.Message
		select {
		case m = <-q:
		case <-ctx.Done():
			conn.Close()
			return
		case <-stop:
			return
		}
		ask.ID = txnid.Zero
		for more := true; more; {
			switch m := m.(type) {
			case *wire.BeatAsk:
				ask.ID = max(ask.ID, m.ID)
			case *wire.Beat:
				beat = m
			default:
				if beat != nil {
					if err := conn.Write(ctx, beat); err != nil {
						conn.Close()
						return
					}
					beat = nil
				}
				if err := conn.Write(ctx, m); err != nil {
					conn.Close()
					return
				}
			}
			select {
			case m = <-q:
			default:
				more = false
			}
		}
		if beat != nil {
			if err := conn.Write(ctx, beat); err != nil {
				conn.Close()
				return
			}
			beat = nil
		}
		if ask.ID != txnid.Zero {
			if err := conn.Write(ctx, &ask); err != nil {
				conn.Close()
				return
			}
		}
		if err := conn.Flush(); err != nil {
			conn.Close()
			return
		}
	}
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

// initiator drives the initiator core (recovery.Initiator), which assigns
// txn IDs, says whom each call waits for and when a heartbeat is due, and
// keeps each feed's state: this side dials and runs the feeds out, maps
// BeatEvery to the core's ticks and the membership view to its
// InitiatorView, and queues the core's messages on the feeds.
type initiator struct {
	n *Node

	mu   sync.Mutex
	core *recovery.Initiator
	// outs are the open feeds' connections, by node: the ones the core
	// has open.
	outs map[string]*feedOut
	// view is the membership view iv was made of; polled is the one the
	// core was last given in a poll, whose addresses its dials use.
	view, polled *view
	iv           *recovery.InitiatorView
	// dials are the goroutines of the feeds out.
	dials sync.WaitGroup
	// opened is when each node's feed last opened or resumed, and
	// whether that open was answered wire.Fenced: a fenced process
	// registers again only with feeds that opened after their nodes took
	// it for dead (mayRegister).
	opened map[string]feedOpened
	// toldFenced is when each node whose feed waits for its floor told
	// this process it was taken for dead (fencedEarly): it counts for
	// mayRegister as a feed open that was answered wire.Fenced.
	toldFenced map[string]time.Time
	// lost is, per node, since when the initiator has had no feed open
	// to which of its processes: its last feed there ended, or a dial
	// failed with none open. A node's entry goes when a feed opens
	// (unreachable).
	lost map[string]feedGone
	// fwd are the calls this node forwarded to a holder of their
	// partition and not yet answered, by the number they went out with
	// on the feed there, which fwdSeq gives.
	fwd    map[uint64]*forward
	fwdSeq uint64
}

// feedOpened is when a feed out opened, and whether its node answered
// the open wire.Fenced: it had taken this process for dead by then.
type feedOpened struct {
	at     time.Time
	fenced bool
}

// forward is a client's call forwarded to node, a holder of its
// partition: the answer comes back on the feed there (wire.Reply).
type forward struct {
	node string
	req  uint64
	send func(*wire.Reply)
}

type feedOut struct {
	node   string
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

// beatTicks is the core's ticks per BeatEvery (a tick is a BeatEvery): a
// heartbeat goes out after a BeatEvery with nothing sent.
const beatTicks = 1

// beatLeadQuiet is how long an initiator sequences nothing before its
// heartbeats lead (Config.BeatLead): long enough that a node writing
// steadily never leads, its IDs staying at its clock.
const beatLeadQuiet = 25 * time.Millisecond

func newInitiator(n *Node) (*initiator, error) {
	clock := func() int64 { return time.Now().UnixMilli() }
	if n.cfg.knobs.clock != nil {
		clock = n.cfg.knobs.clock
	}
	in := &initiator{n: n, outs: map[string]*feedOut{}, fwd: map[uint64]*forward{}}
	core, err := recovery.NewInitiator(recovery.InitiatorConfig{
		Node: n.id, ID: txnid.Initiator(n.cfg.ID), Clock: clock, Partitions: n.cluster.Partitions, BeatTicks: beatTicks,
		BeatLeadMillis: n.cfg.BeatLead.Milliseconds(), BeatLeadQuietTicks: max(1, int(beatLeadQuiet/n.cfg.BeatEvery)),
		Joins: true, CallTicks: max(1, int(n.cfg.CallWait/n.cfg.BeatEvery)),
		Knobs: recovery.InitiatorKnobs{SkipSend: n.cfg.knobs.skip, Plant: n.maybePlant},
	}, (*initiatorIO)(in))
	if err != nil {
		return nil, err
	}
	in.core = core
	return in, nil
}

// initiatorIO is the core's I/O (recovery.InitiatorIO), called with
// in.mu held.
type initiatorIO initiator

func (io *initiatorIO) Send(node string, m wire.Message) bool {
	f := io.outs[node]
	return f != nil && f.send(m)
}

func (io *initiatorIO) Close(node string) {
	if f := io.outs[node]; f != nil {
		f.close()
	}
}

func (io *initiatorIO) Dial(node string, d recovery.DialAsk) {
	in := (*initiator)(io)
	addr := in.polled.nodes[node].Address
	in.dials.Add(1)
	go func() {
		defer in.dials.Done()
		in.openFeed(node, addr, d)
	}()
}

// viewLocked returns v as the core's view; in.mu held. A view is read
// every 100 ms and never changed once read, so the last one is kept.
func (in *initiator) viewLocked(v *view) *recovery.InitiatorView {
	if v == in.view {
		return in.iv
	}
	iv := &recovery.InitiatorView{Nodes: make(map[string]int64, len(v.nodes)),
		Placement: make(map[uint32][]recovery.ReplicaPlace, len(v.placement)), Bootstrapped: v.bootstrapped}
	for node, rec := range v.nodes {
		iv.Nodes[node] = incarnation(rec)
	}
	for p, rps := range v.placement {
		ps := make([]recovery.ReplicaPlace, len(rps))
		for i, rp := range rps {
			ps[i] = recovery.ReplicaPlace{Node: rp.node, Live: rp.live, Rev: rp.rev}
		}
		iv.Placement[p] = ps
	}
	in.view, in.iv = v, iv
	return iv
}

// feedWait bounds how long a call waits for the feeds to a partition's
// replicas to open. A node that just registered is dialled within a
// membership poll (100 ms); a call in the meantime would have to fail.
const feedWait = 3 * time.Second

// sequence sequences a call and sends it to its partition's replicas, or
// to a node that holds one if this node holds none (forward). While the
// core refuses it for a feed not yet open (recovery.Unfed), it waits, up
// to feedWait, with the view read afresh, on a goroutine of its own:
// whoever reads the calls, a client's connection or a feed's reader,
// goes on with the next, nearly all sequenced at once. A call that waited
// on the reader held every call behind it on the connection, of every
// partition: partitions no fault touched went 1.9 s without a successful
// op while a restarted node's feed could not open (rejoin chaos --seed
// 20261128, 10m; TestWaitingCallHoldsNoOtherCall). Its reply may come
// after those of calls sent after it, as for calls sent at once on two
// connections. forwarded says the call came forwarded from another node.
func (n *Node) sequence(req *wire.Call, reply func(*wire.Reply), forwarded bool) {
	if n.init.submitCall(req, reply, forwarded, false) {
		return
	}
	n.waiting.Add(1)
	go func() {
		defer n.waiting.Done()
		n.init.submitCall(req, reply, forwarded, true)
	}()
}

// submitCall is sequence's: forwarded says the call came forwarded from
// another node, and is not forwarded again. With wait false, a call that
// would wait for a feed returns false at once, not counted, not
// answered, nothing sent: the caller tries again with wait.
func (in *initiator) submitCall(req *wire.Call, reply func(*wire.Reply), forwarded, wait bool) bool {
	n := in.n
	n.lastCall.Store(time.Now().UnixNano())
	// Counted until answered: a graceful stop waits for it (drainCalls).
	// Counted before stopping is read, as drainCalls sets stopping before
	// it reads the count: one of the two sees the other.
	n.inCalls.Add(1)
	if n.stopping.Load() {
		n.inCalls.Add(-1)
		reply(&wire.Reply{Req: req.Req, Err: fmt.Sprintf("node %s is stopping: it takes no new call (nothing was sequenced; another node takes it)", n.id),
			Refused: wire.RefusedStopping})
		return true
	}
	send := func(r *wire.Reply) {
		n.inCalls.Add(-1)
		reply(r)
	}
	deadline := time.Now().Add(feedWait)
	for {
		v := in.n.members.view()
		if rps := v.placement[req.Partition]; len(rps) > 0 && !slices.ContainsFunc(rps, func(rp replicaPlace) bool { return rp.node == n.id }) {
			// Only the nodes holding a replica of a partition sequence
			// its txns, so its replicas wait for no other node's
			// initiator (docs/DESIGN.md "Sequencers per partition").
			hs := liveFirst(layout.SequencerOrder(req.Partition, v.holders(req.Partition)), rps)
			switch {
			case forwarded:
				send(&wire.Reply{Req: req.Req, Err: fmt.Sprintf("node %s holds no replica of partition %d and sequences none of its txns; %s do: nothing was sequenced",
					n.id, req.Partition, strings.Join(hs, ", ")), Refused: wire.RefusedNotHolder})
				return true
			case in.forward(hs, req, send):
				return true
			case in.unreachable(hs):
				send(&wire.Reply{Req: req.Req, Err: fmt.Sprintf("partition %d: node %s holds no replica of it and has had no feed open to %s, which do, for %v: the txn was sent nowhere",
					req.Partition, n.id, strings.Join(hs, ", "), unreachableAfter), Refused: wire.RefusedNotReady})
				return true
			case !time.Now().Before(deadline) || in.n.ctx.Err() != nil:
				send(&wire.Reply{Req: req.Req, Err: fmt.Sprintf("partition %d: node %s holds no replica of it and has no feed open to %s, which do, after %v: the txn was sent nowhere",
					req.Partition, n.id, strings.Join(hs, ", "), feedWait), Refused: wire.RefusedNotReady})
				return true
			}
			if !in.retryWait(wait) {
				return false
			}
			continue
		}
		registered := in.n.reg.Registered()
		var err error
		if registered && in.n.viewBehindTerm(v) {
			err = errViewBehind // reconcile.go
		} else {
			in.mu.Lock()
			err = in.core.Submit(in.viewLocked(v), registered, req, send)
			if err == nil {
				in.askBeatsLocked(in.core.Last())
			}
			in.mu.Unlock()
		}
		var unfed *recovery.UnfedError
		if err == nil {
			return true
		}
		over := !time.Now().Before(deadline) || in.n.ctx.Err() != nil
		var refused *recovery.RefusedError
		switch {
		case errors.Is(err, errViewBehind):
			if over {
				send(&wire.Reply{Req: req.Req, Err: fmt.Sprintf("%v after %v: the txn was sent nowhere", err, feedWait), Refused: wire.RefusedNotReady})
				return true
			}
		case errors.As(err, &refused):
			send(&wire.Reply{Req: req.Req, Err: err.Error(), Refused: refused.Refused})
			return true
		case !errors.As(err, &unfed):
			send(&wire.Reply{Req: req.Req, Err: heldText(v, req.Partition, err)})
			return true
		case over:
			send(&wire.Reply{Req: req.Req, Err: fmt.Sprintf("%v (after %v)", unfed, feedWait), Refused: wire.RefusedNotReady})
			return true
		case !unfed.Joining && in.unreachable(unfed.Nodes):
			send(&wire.Reply{Req: req.Req, Err: fmt.Sprintf("%v (no feed open there for %v)", unfed, unreachableAfter), Refused: wire.RefusedNotReady})
			return true
		}
		if !in.retryWait(wait) {
			return false
		}
	}
}

// retryWait is submitCall's pause before it tries a call again. Without
// wait it does not pause: it uncounts the call, which is neither sent nor
// answered, and reports false for submitCall to return.
func (in *initiator) retryWait(wait bool) bool {
	if !wait {
		in.n.inCalls.Add(-1)
		return false
	}
	select {
	case <-time.After(10 * time.Millisecond):
	case <-in.n.ctx.Done():
	}
	return true
}

// liveFirst is hs, holders in layout.SequencerOrder, with those whose
// replica rps has live first, in the same order otherwise: the ones a
// forwarded call goes to. A holder whose replica is not live has mostly
// just restarted, and its new feeds open only once its peers settled its
// old process's tail, which can wait on a peer that holds no replica of
// the partition: a call forwarded to it waited for that. Right after n2
// restarted while n3 was stopped, n2's feeds opened 0.86 s after it was
// ready, and partition 6, with no replica on n3, had no successful op
// for 0.84 s, its probe's calls through n1 forwarded to n2 (rejoin chaos
// --net-faults on --seed 406596625, 3m, +145.56 s).
func liveFirst(hs []string, rps []replicaPlace) []string {
	live := func(h string) bool {
		return slices.ContainsFunc(rps, func(rp replicaPlace) bool { return rp.node == h && rp.live })
	}
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		if live(h) {
			out = append(out, h)
		}
	}
	for _, h := range hs {
		if !live(h) {
			out = append(out, h)
		}
	}
	return out
}

// forward sends req to the first of hs, holders of its partition in
// layout.SequencerOrder, that this node has an open feed to and takes for
// alive, and reports whether it did. Its answer comes back on that feed
// (forwarded), and goes to send with the client's number; if the feed
// ends first, or the holder is taken for dead, the call's outcome is
// unknown (forwardsLost).
func (in *initiator) forward(hs []string, req *wire.Call, send func(*wire.Reply)) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.polled == nil {
		return false // no view yet, so no feed either
	}
	for _, h := range hs {
		f := in.outs[h]
		if f == nil || h == in.n.id {
			continue
		}
		if _, alive := in.polled.nodes[h]; !alive {
			continue // taken for dead: its feed lingers until it breaks
		}
		in.fwdSeq++
		call := *req
		call.Req = in.fwdSeq
		in.fwd[call.Req] = &forward{node: h, req: req.Req, send: send}
		if f.send(&call) {
			return true
		}
		delete(in.fwd, call.Req)
	}
	return false
}

// heldText is the text of err, a call's refusal, which says so if the
// partition has no live replica because one is held (docs/DESIGN.md
// "Holding a partition"): a client can tell a partition that waits for
// an admin from one that waits for a rejoin.
func heldText(v *view, p uint32, err error) string {
	if !errors.Is(err, recovery.ErrNoLiveReplica) {
		return err.Error()
	}
	for _, pl := range v.placement[p] {
		if pl.held != "" {
			return fmt.Sprintf("%v: partition %d is held on %s, whose replica may lack txns (%s); it answers again once a replica that holds them comes back, or an admin accepts the loss (rejoin accept-loss --partition %d)", err, p, pl.node, pl.held, p)
		}
	}
	return err.Error()
}

// forwarded passes on the answer to a call forwarded to node.
func (in *initiator) forwarded(node string, r *wire.Reply) {
	in.mu.Lock()
	fw := in.fwd[r.Req]
	if fw != nil && fw.node == node {
		delete(in.fwd, r.Req)
	} else {
		fw = nil
	}
	in.mu.Unlock()
	if fw == nil {
		return // a number this node never sent there: ignored
	}
	// The message is the stream's until its next Recv.
	out := wire.Reply{Req: fw.req, ID: r.ID, Out: slices.Clone(r.Out), Err: r.Err, Uncertain: r.Uncertain, Refused: r.Refused}
	if out.Refused == wire.RefusedStopping {
		// The holder stops, not this node: the client should not take
		// this one for stopping.
		out.Refused = wire.RefusedNotReady
	}
	for _, e := range r.Each {
		out.Each = append(out.Each, wire.ReplicaOut{Node: e.Node, Out: slices.Clone(e.Out), Err: e.Err})
	}
	fw.send(&out)
}

// forwardsLost answers the calls forwarded to node whose feed there
// ended: each may have been sequenced there, or not.
func (in *initiator) forwardsLost(node string) {
	in.mu.Lock()
	var lost []*forward
	for seq, fw := range in.fwd {
		if fw.node == node {
			lost = append(lost, fw)
			delete(in.fwd, seq)
		}
	}
	in.mu.Unlock()
	for _, fw := range lost {
		fw.send(&wire.Reply{Req: fw.req, Err: fmt.Sprintf("the call was forwarded to %s, which holds a replica of its partition, and the feed there ended before its answer: the txn's outcome is unknown", node), Uncertain: true})
	}
}

// askBeatsLocked asks every other node's initiator for a heartbeat above
// id, the txn just sent, so the replicas that got it need not wait for
// their periodic heartbeats (docs/DESIGN.md "Heartbeats on demand"); in.mu
// held. An ask is only ever a shortcut: one that finds a full queue is
// dropped, and the feed stays.
func (in *initiator) askBeatsLocked(id txnid.ID) {
	ask := &wire.BeatAsk{ID: id}
	for node, f := range in.outs {
		if node == in.n.id {
			continue // this initiator sent id: it is past it
		}
		select {
		case f.q <- ask:
		default:
		}
	}
}

// beatPast answers a BeatAsk from another initiator's feed: this
// initiator's heartbeat above id on every feed it has open.
func (in *initiator) beatPast(id txnid.ID) {
	in.mu.Lock()
	in.core.BeatPast(id)
	in.mu.Unlock()
}

// feedFloorWait bounds the wait for a feed's floor. The receiver sends it
// once the initiator's previous feed there is settled, which may take a
// tail repair from each peer, as long as a live peer cannot be reached
// (repair.go); a dial that waits longer fails, and a later view dials
// again.
const feedFloorWait = time.Minute

// recvFloor reads a feed's first answer: the receiver's floor, the highest
// txn ID its replicas executed before they began to track this initiator;
// or, to a hello that asked to resume, where the receiver stopped on the
// broken feed (resumed). Before a floor, a wire.Fenced may say this
// process was taken for dead there (fenced, its partitions), given to
// told as it comes.
func recvFloor(ctx context.Context, conn *stream.Conn, wait time.Duration, told func(*wire.Fenced)) (_ txnid.ID, resumed bool, fenced *wire.Fenced, _ error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	for {
		m, err := conn.Recv()
		if ctx.Err() != nil {
			return txnid.Zero, false, nil, fmt.Errorf("no floor within %s: %w", wait, ctx.Err())
		}
		if err != nil {
			return txnid.Zero, false, nil, err
		}
		switch m := m.(type) {
		case *wire.Beat:
			return m.ID, false, fenced, nil
		case *wire.FeedAck:
			if fenced != nil {
				return txnid.Zero, false, nil, fmt.Errorf("feed resumed after it was fenced")
			}
			return m.ID, true, nil, nil
		case *wire.Fenced:
			fenced = &wire.Fenced{Partitions: slices.Clone(m.Partitions)}
			told(fenced)
		case *wire.Done:
			// A result of a txn of this node's previous process: results
			// go back on the initiator's feed, and the receiver counts
			// this one its feed as soon as its hello is in. Nothing of
			// this process was sent yet, so nothing waits for it.
		default:
			return txnid.Zero, false, nil, fmt.Errorf("expected the feed's floor, got %v", m.Type())
		}
	}
}

// run ticks the core every BeatEvery and gives it the membership view
// every poll, which keeps a feed open to every live node.
func (in *initiator) run() {
	t := time.NewTicker(in.n.cfg.BeatEvery)
	defer t.Stop()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	defer func() {
		in.mu.Lock()
		for _, f := range in.outs {
			f.close()
		}
		in.mu.Unlock()
		in.dials.Wait()
	}()
	for {
		select {
		case <-in.n.ctx.Done():
			return
		case <-t.C:
			in.mu.Lock()
			in.core.Tick()
			expired := in.core.Expired()
			in.mu.Unlock()
			for _, e := range expired {
				in.n.log.Warn("a call waited out --call-wait for its replicas' results: answered as of unknown outcome",
					"partition", e.Partition, "txn", e.ID, "waited_for", e.Waited, "waited", time.Duration(e.Millis)*time.Millisecond)
			}
		case <-poll.C:
			v := in.n.members.view()
			in.mu.Lock()
			in.polled = v
			in.core.SetView(in.viewLocked(v))
			var gone []string
			for _, fw := range in.fwd {
				if _, ok := v.nodes[fw.node]; !ok && !slices.Contains(gone, fw.node) {
					gone = append(gone, fw.node)
				}
			}
			in.mu.Unlock()
			// A holder taken for dead keeps its feed here until the
			// connection breaks, and will not answer what was forwarded
			// to it: its callers try another node.
			for _, node := range gone {
				in.forwardsLost(node)
			}
		}
	}
}

// termStands reports whether the registration term the process runs now
// still has its record in etcd, read afresh: a node's Fenced answer then
// speaks of an earlier term, whose end the process saw (termLost). False
// when etcd does not answer within a second.
func (n *Node) termStands() bool {
	if n.reg == nil {
		return false
	}
	t := n.reg.Term()
	if t == nil || t.Err() != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(n.ctx, time.Second)
	defer cancel()
	resp, err := n.cli.Get(ctx, supervise.NodeKey(n.id))
	return err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == t.Created
}

// fenced: node took this process for dead and agreed with its peers on
// where its txns end; what it sent past that runs nowhere there. The
// replicas here of the partitions node holds live may have run it, or
// will: they fail, before the feed opens and the calls that waited for
// node are answered as of unknown outcome (recovery.Initiator.FeedOpened).
func (in *initiator) fenced(node string, ps []uint32) {
	why := fmt.Sprintf("node %s took this process for dead and its live replicas of this partition ran on without its last txns", node)
	hosted := in.n.hosted()
	lost := in.n.termLost.Load()
	if lost != 0 && !in.n.termStands() {
		// The term the process runs now may be the one taken for dead,
		// its end not seen here yet: it may have sequenced since lost.
		lost = 0
	}
	failed, kept := 0, 0
	for _, p := range ps {
		if r := hosted[p]; r != nil {
			if ok, _ := ask(r, func(r *replica) bool {
				if lost != 0 && r.builtFrom.UnixNano() > lost {
					// Rebuilt after the process saw its last term end, from
					// a peer that took it for dead too, and the term it
					// runs now stands, so the answer speaks of an earlier
					// one: it holds none of the txns the process sent
					// before it knew, which is all the answering node ran
					// on without (no txn is sequenced unregistered).
					// Failed, the last live replica of a partition went
					// whenever the answer came from a node that had itself
					// been fenced since (rejoin chaos --seed 271828, 10m:
					// partition 3 lost for good, its other two replicas
					// killed and not yet rebuilt).
					kept++
					return false
				}
				r.lose(why)
				return true
			}); ok {
				failed++
			}
		}
	}
	in.mu.Lock()
	in.core.Fenced()
	in.mu.Unlock()
	in.n.log.Warn("fenced by a node that took this process for dead", "node", node, "partitions", len(ps), "replicas_failed", failed, "rebuilt_since_kept", kept)
}

// selfFeed is the feed to the initiator's own node: an in-process pipe
// served as an accepted connection is, hello and floor included, but
// without TCP and TLS. A third of a write's frames on a node of three
// replicas went to its own node over loopback TLS, each encrypted,
// decrypted and passed through the kernel twice (the txn and its Done).
// Nothing outside the process reaches the pipe, so the hello is checked
// as on an insecure node (authorize with no peer); its writer and
// reader are goroutines on each side, so a pipe's unbuffered writes
// cannot block one direction on the other. Its server ends when the
// pipe closes; the dial's wait group waits for it.
func (in *initiator) selfFeed(cfg stream.Config) *stream.Conn {
	cfg.TLS = nil
	a, b := net.Pipe()
	srv := stream.NewConn(b, cfg)
	in.dials.Add(1)
	go func() {
		defer in.dials.Done()
		defer srv.Close()
		in.n.serve(srv, nil, nil)
	}()
	return stream.NewConn(a, cfg)
}

// openFeed dials node with the hello d says and runs the feed until it
// breaks.
func (in *initiator) openFeed(node, addr string, d recovery.DialAsk) {
	if f := in.n.cfg.knobs.noFeedTo; f != nil && f(node) {
		in.mu.Lock()
		in.core.DialFailed(node)
		in.mu.Unlock()
		return
	}
	// The opening (dial, hello, floor) ends once the view no longer has
	// the process it is for (openWatch).
	openCtx, endOpen := context.WithCancel(in.n.ctx)
	go in.openWatch(openCtx, endOpen, node, d.Inc)
	defer endOpen()
	dialWait := feedDialWait
	if d := in.n.cfg.knobs.feedDialWait; d > 0 {
		dialWait = d
	}
	ctx, cancel := context.WithTimeout(openCtx, dialWait)
	cfg := in.n.dialConfig(node)
	cfg.StallWindow = 0 // a feed may be idle one way; node death is etcd's to tell
	var conn *stream.Conn
	var err error
	if node == in.n.id {
		conn = in.selfFeed(cfg)
	} else {
		conn, err = stream.Dial(ctx, addr, cfg)
	}
	if err == nil {
		err = hello(ctx, conn, &wire.Hello{Kind: wire.HelloFeed, Node: in.n.id, Initiator: uint16(in.n.cfg.ID), Epoch: in.n.incarnation(),
			Missed: d.Missed, Resume: d.Resume, Kept: d.Kept, To: uint64(d.Inc)}, node)
		if err != nil {
			conn.Close()
		}
	}
	cancel()
	var floor txnid.ID
	var resumed bool
	var fenced *wire.Fenced
	told := func(f *wire.Fenced) {
		// Before the floor: the replicas fail now, not once the
		// receiver's repair of this process's tail ends, and the node
		// counts for the registration's gate meanwhile.
		in.fenced(node, f.Partitions)
		in.mu.Lock()
		if in.toldFenced == nil {
			in.toldFenced = map[string]time.Time{}
		}
		in.toldFenced[node] = time.Now()
		in.mu.Unlock()
	}
	if err == nil {
		if floor, resumed, fenced, err = recvFloor(openCtx, conn, feedFloorWait, told); err != nil {
			conn.Close()
		} else if resumed && !d.Resume {
			err = fmt.Errorf("feed to %s resumed though the hello did not ask", node)
			conn.Close()
		} else if f := in.n.cfg.knobs.loseFloor; f != nil && f(node) {
			err = fmt.Errorf("feed to %s: its floor lost (testing knob)", node)
			conn.Close()
		}
	}
	endOpen()
	in.mu.Lock()
	delete(in.toldFenced, node)
	in.mu.Unlock()
	if err != nil {
		in.mu.Lock()
		in.core.DialFailed(node)
		in.noteLostLocked(node, d.Inc)
		in.mu.Unlock()
		if in.n.ctx.Err() == nil {
			in.n.limited.Log(slog.LevelInfo, "feed-dial/"+node, "feed dial failed", "node", node, "err", err)
		}
		return
	}
	f := &feedOut{node: node, conn: conn, q: make(chan wire.Message, feedQueueMax), broken: make(chan struct{})}
	in.mu.Lock()
	in.outs[node] = f
	if in.opened == nil {
		in.opened = map[string]feedOpened{}
	}
	in.opened[node] = feedOpened{at: time.Now(), fenced: fenced != nil}
	delete(in.lost, node)
	if resumed {
		in.core.FeedResumed(node, floor)
	} else {
		in.core.FeedOpened(node, floor)
	}
	in.mu.Unlock()
	in.n.log.Info("feed open", "to", node, "resumed", resumed)
	if f := in.n.cfg.knobs.feedOpen; f != nil {
		f(node)
	}
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
		switch m := m.(type) {
		case *wire.Done:
			in.mu.Lock()
			in.core.OnDone(node, m)
			in.mu.Unlock()
		case *wire.FeedAck:
			in.mu.Lock()
			in.core.FeedAcked(node, m.ID)
			in.mu.Unlock()
		case *wire.Joined:
			in.mu.Lock()
			in.core.Joined(node, m.Partition, m.Floor)
			in.mu.Unlock()
		case *wire.Reply:
			in.forwarded(node, m)
		}
	}
	f.close()
	<-done
	in.mu.Lock()
	delete(in.outs, node)
	in.core.FeedLost(node)
	in.noteLostLocked(node, d.Inc)
	in.mu.Unlock()
	in.forwardsLost(node)
	in.n.log.Info("feed closed", "to", node)
}

// feedDialWait bounds a feed's dial and hello.
const feedDialWait = 2 * time.Second

// openWatchEvery is how often a feed's opening looks whether the view
// still has the process it is for (openWatch).
const openWatchEvery = 20 * time.Millisecond

// openWatch ends a feed's opening (end) once the view no longer has
// node's process inc: gone (fenced, its lease ended, stopped) or
// restarted. While a feed is being opened, every call of a partition the
// node holds waits for it, as a txn sent meanwhile would be missed there
// and not named in the hello (recovery.ReplicaFeed.Dialing): a dial into
// dropped packets held them up to its 2 s timeout past the node's fence,
// a floor that never came up to feedFloorWait. Chaos seed 5150 (10m,
// +6.63 s): n2 and n3 cut from the others and n3 restarted; partitions
// 2, 4, 5 and 7 went 4.1 s without a successful op, until the dials to
// n3 begun before its fence timed out 1.6 s after it. Ended, the dial
// fails; the core dials the node's new process, if any, naming all that
// it missed.
func (in *initiator) openWatch(ctx context.Context, end context.CancelFunc, node string, inc int64) {
	t := time.NewTicker(openWatchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		v := in.n.members.view()
		if v == nil {
			continue
		}
		if rec, ok := v.nodes[node]; !ok || incarnation(rec) != inc {
			end()
			return
		}
	}
}

// feedGone is since when the initiator has had no feed open to a node's
// process inc.
type feedGone struct {
	since time.Time
	inc   int64
}

// noteLostLocked notes that the initiator has no feed open to node's
// process inc from now, unless it had none to that process already;
// in.mu held.
func (in *initiator) noteLostLocked(node string, inc int64) {
	if _, open := in.outs[node]; open {
		return
	}
	if in.lost == nil {
		in.lost = map[string]feedGone{}
	}
	if g, ok := in.lost[node]; !ok || g.inc != inc {
		in.lost[node] = feedGone{since: time.Now(), inc: inc}
	}
}

// unreachableAfter is how long the initiator has had no feed to a node
// before a call that waits for one is refused at once, rather than after
// feedWait: a node dialled afresh opens its feed within a membership
// poll, and one that did not for this long is cut off, stopped or dead,
// which its fence settles in seconds. The caller tries another node: a
// chaos probe's call through a node cut from its peers, after one through
// a node stopped, waited 250 ms for each, and a partition neither held a
// replica of went 0.52 s without a successful op (rejoin chaos --seed
// 20261128, 10m, +33.54 s).
const unreachableAfter = time.Second

// unreachable reports whether the initiator has had no feed open to any
// of nodes (this one aside), as the view has their processes, for
// unreachableAfter. A process the view has newer than the one lost is
// not yet tried: a node restarted is dialled afresh, and the calls made
// meanwhile wait for it (TestNodeRestartRejoins refused them while n3's
// new process was being dialled, its old feed lost for longer).
func (in *initiator) unreachable(nodes []string) bool {
	v := in.n.members.view()
	if v == nil {
		return false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	some := false
	for _, node := range nodes {
		if node == in.n.id {
			continue
		}
		g, ok := in.lost[node]
		rec, alive := v.nodes[node]
		if !ok || !alive || g.inc != incarnation(rec) || time.Since(g.since) < unreachableAfter {
			return false
		}
		some = true
	}
	return some
}
