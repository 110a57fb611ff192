package sim

import (
	"fmt"
	"maps"
	"slices"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// The simulator's initiators are the product's initiator core
// (recovery.Initiator), which recovery/node's feed.go drives too: txn
// IDs, the heartbeat schedule in ticks, the feeds' states and floors, and
// the rule that a txn goes out only with a feed to every node holding a
// replica of its partition (recovery.Unfed). What the world adds is the
// network: a message the core sends is routed to the oracle at once and
// over links to the source replicas and the destination replica.

// oracleNode is the oracle's name among the core's nodes: it holds a
// replica of the partition that is never waited for and hears every
// initiator from the start.
const oracleNode = "oracle"

// initiatorView is the initiators' membership view: every node alive,
// the sources' replicas live, the destination's and the oracle's not
// (the workload is not waited on: no caller).
func initiatorView(srcIDs []string) *recovery.InitiatorView {
	v := &recovery.InitiatorView{Nodes: map[string]int64{dstNode: 1, oracleNode: 1}, Bootstrapped: true}
	var ps []recovery.ReplicaPlace
	for _, id := range srcIDs {
		v.Nodes[id] = 1
		ps = append(ps, recovery.ReplicaPlace{Node: id, Live: true})
	}
	ps = append(ps, recovery.ReplicaPlace{Node: dstNode}, recovery.ReplicaPlace{Node: oracleNode})
	v.Placement = map[uint32][]recovery.ReplicaPlace{partitionID: ps}
	return v
}

// unawareView is v without the destination node: a stale view.
func unawareView(v *recovery.InitiatorView) *recovery.InitiatorView {
	u := *v
	u.Nodes = map[string]int64{}
	for n, inc := range v.Nodes {
		if n != dstNode {
			u.Nodes[n] = inc
		}
	}
	return &u
}

// initiatorFeeds is an initiator's recovery.InitiatorIO: it keeps what
// the core sent, for routeFeed, and the dials it asked, for dial.
type initiatorFeeds struct {
	in    *initiator
	dials []string
	// asks is what each dial's hello says (wire.Hello).
	asks map[string]recovery.DialAsk
	// closes are the feeds the core asked to close in the FeedResumed of
	// resuming (resumeFeed); a close asked in any other input breaks the
	// feed at once (closedBySender).
	closes   []string
	resuming string
	w        *world
}

// Send queues m for node. The core sends one message to several nodes
// as consecutive calls with the same m, which make one entry; a resumed
// feed's resend is many messages in one input, each an entry, in order.
func (f *initiatorFeeds) Send(node string, m wire.Message) bool {
	in := f.in
	if n := len(in.out); n > 0 && in.out[n-1].m == m {
		in.out[n-1].to[node] = true
		return true
	}
	in.out = append(in.out, outMsg{m: m, to: map[string]bool{node: true}})
	return true
}

func (f *initiatorFeeds) Dial(node string, d recovery.DialAsk) {
	f.dials = append(f.dials, node)
	if f.asks == nil {
		f.asks = map[string]recovery.DialAsk{}
	}
	f.asks[node] = d
}

// Close is asked of a feed just resumed whose log dropped txns above
// where the node stopped (recovery.Initiator.FeedResumed): the world
// breaks it once the input returns (resumeFeed). It is also asked by a
// Submit of an open feed whose log is full to a node taken for dead: the
// feed is then lost at once (closedBySender). Before, that close was left
// in closes, and the next resume of the feed took it for its own: the
// world broke the resumed feed while the core had resent its log on it,
// and the node read that resend and the next resume's again (seed
// 1490228980: a txn executed twice at a source). No node of the world
// changes its process, so nothing else asks.
func (f *initiatorFeeds) Close(node string) {
	if node != f.resuming {
		f.w.closedBySender(f.in, node)
		return
	}
	f.closes = append(f.closes, node)
}

func (w *world) newInitiatorCore(in *initiator) {
	in.feeds = &initiatorFeeds{in: in, w: w}
	core, err := recovery.NewInitiator(recovery.InitiatorConfig{
		Node: fmt.Sprintf("i%d", in.id), ID: in.id, Partitions: partitionID + 1, BeatTicks: max(1, w.k.HeartbeatTicks),
		Clock:          func() int64 { return baseMillis + int64(w.tick) + in.skew },
		BeatLeadMillis: int64(w.lead()), BeatLeadQuietTicks: w.k.BeatLeadQuietTicks,
		FeedLogBytesMax: w.k.FeedLogBytesMax, Joins: w.k.Joins,
	}, in.feeds)
	if err != nil {
		panic(err)
	}
	in.core = core
}

// lead is the initiators' heartbeat lead: none in a scripted run, whose
// scenarios name heartbeat IDs at the clock.
func (w *world) lead() int {
	if w.scripted {
		return 0
	}
	return w.k.BeatLeadTicks
}

// dial gives in's core the view and answers the dials it asks: a feed
// opens, with its receiver's floor, unless in is late and the script has
// not opened its feed to that node (opened), then the dial fails. A
// redial of a broken feed to a source node fails while the node is out
// of reach (dead, or its gap not over), and is answered some ticks later
// (stepFeeds): the core logs txns for the node meanwhile.
func (w *world) dial(in *initiator) {
	in.core.SetView(w.view)
	dials := in.feeds.dials
	in.feeds.dials = nil
	for _, node := range dials {
		if in.late && node != oracleNode && !in.opened[node] {
			in.core.DialFailed(node)
			continue
		}
		ask := in.feeds.asks[node]
		if sr := w.srcNamed(node); sr != nil && sr.broke[in.idx] {
			if sr.dead || w.tick < sr.redialAt[in.idx] {
				in.core.DialFailed(node)
				continue
			}
			if n := w.feedDraw(w.k.FeedDialTicksMax); n > 0 {
				sr.dialing[in.idx] = &pendingDial{ask: ask, at: w.tick + uint64(n)}
				w.tracef("i%d: redials %s (resume %v, kept %v, missed %v); the answer takes %d ticks", in.id, node, ask.Resume, ask.Kept, ask.Missed, n)
				continue
			}
		}
		w.answerDial(in, node, ask)
	}
}

// answerDial answers one of in's dials: the node dialled opens the feed,
// or resumes a broken one (openFeed).
func (w *world) answerDial(in *initiator, node string, d recovery.DialAsk) {
	if sr := w.srcNamed(node); sr != nil && sr.dead {
		in.core.DialFailed(node)
		return
	}
	w.openFeed(in, node, d)
}

// openFeed opens in's feed to node as recovery/node's serveFeed does: the
// node's replicas track in from now on (a destination through
// Destination.AddInitiator), and the floor is the highest txn ID they
// executed. The oracle tracks every initiator from the start but a
// joiner, from its feed on. A source node keeps what the hello says in
// missed; a feed re-opened by the same process resumes the broken one or
// fails its replica, by the node's rule (takeUp).
func (w *world) openFeed(in *initiator, node string, d recovery.DialAsk) {
	missed := d.Missed
	floor := txnid.Zero
	switch node {
	case oracleNode:
		if in.joiner {
			w.ref.AddInitiator(in.id)
			floor = w.ref.LastExecuted()
		}
	case dstNode:
		// Its replica core tracks in, and so does its attempt, running or
		// live; the floor is what the replica executed (Zero unless live).
		// At setup the core is not built yet: it hears every fed
		// initiator from the start. With joins it tracks in from its join.
		if w.dst != nil {
			if !w.k.Joins {
				w.dst.AddInitiator(in.id)
				if a := w.dstAttempt(); a != nil {
					w.afterCall(a)
				}
			}
			floor = w.dst.JoinFloor()
		}
	default:
		for _, sr := range w.srcs {
			if sr.id != node {
				continue
			}
			w.conns++
			sr.conns[in.idx] = w.conns
			sr.told[in.idx] = append(sr.told[in.idx], toldHello{conn: w.conns, missed: missed})
			if sr.broke[in.idx] {
				sr.broke[in.idx] = false
				if !sr.out() {
					resume, why := w.takeUp(sr, in, d)
					if resume {
						w.resumeFeed(in, sr, why)
						return
					}
					w.stats.FailedOnRedial++
					w.loseSource(sr, why)
				}
			}
			// A new feed: the node has read nothing of it yet. With joins
			// its replica tracks in from its join on the feed (joinSource);
			// the feed's floor is what the replica's join would answer.
			sr.recv[in.idx], sr.gapTxns[in.idx] = txnid.Zero, 0
			switch {
			case w.k.Joins:
				sr.joined[in.idx] = false
				floor = max(sr.core.JoinFloor(), sr.tails.Last(in.id))
			case !sr.out():
				sr.core.AddInitiator(in.id)
				sr.joined[in.idx] = true
				floor = sr.core.JoinFloor()
			}
		}
	}
	in.core.FeedOpened(node, floor)
}

// sendTxn sequences a txn of the workload or a script through in's core,
// with the view v, and routes it. An error: the core refused it and
// nothing was sent.
func (w *world) sendTxn(in *initiator, sp txnSpec, v *recovery.InitiatorView) error {
	proc, vals, text := w.invocation(sp)
	params, err := w.enc.AppendTuple(nil, vals)
	if err != nil {
		panic(err)
	}
	if err := in.core.Submit(v, true, &wire.Call{Partition: partitionID, Proc: proc, Params: params}, nil); err != nil {
		w.routeFeed(in) // a refusal may have asked joins (Knobs.Joins)
		return err
	}
	id := in.core.Last()
	w.lastTxn = max(w.lastTxn, id)
	w.stats.Txns++
	if w.tr.on {
		w.tracef("i%d txn %v %s", in.id, id, text)
	}
	w.routeFeed(in)
	if w.k.BeatAsks && !w.scripted {
		for _, o := range w.inits {
			if o != in && (!o.joiner || o.active) && !o.silent {
				w.asks = append(w.asks, beatAsk{to: o, id: id, at: w.tick + 1 + uint64(w.delay(w.k.FeedDelayMax))})
			}
		}
	}
	return nil
}

// beatAsk is one initiator's ask to another for a heartbeat above id,
// answered at tick at (recovery/node: a wire.BeatAsk on a feed).
type beatAsk struct {
	to *initiator
	id txnid.ID
	at uint64
}

// answerAsks answers the asks due: the asked initiator's core sends a
// heartbeat above the ID on each feed that has not had one
// (Initiator.BeatPast), which the world routes as any heartbeat.
func (w *world) answerAsks() {
	for _, a := range takeDue(&w.asks, func(a beatAsk) bool { return a.at <= w.tick }) {
		if a.to.silent {
			continue // a stopped process reads nothing
		}
		w.stats.BeatAsks++
		a.to.core.BeatPast(a.id)
		w.routeFeed(a.to)
	}
}

// takeDue removes from *q, keeping the order of the rest, the items due
// says are due, and returns them in order: the caller acts on them once
// the queue is whole again, so what it queues meanwhile is kept.
func takeDue[T any](q *[]T, due func(T) bool) []T {
	var out []T
	kept := (*q)[:0]
	for _, it := range *q {
		if due(it) {
			out = append(out, it)
		} else {
			kept = append(kept, it)
		}
	}
	var zero T
	for i := len(kept); i < len(*q); i++ {
		(*q)[i] = zero
	}
	*q = kept
	return out
}

// sendHeartbeat has in heartbeat on every open feed now.
func (w *world) sendHeartbeat(in *initiator) {
	in.core.Heartbeat()
	w.routeFeed(in)
}

// routeFeed delivers what in's core sent since the last call, in the
// order it sent it: to the oracle at once, to the source and the current
// destination replicas over their links, where the core sent it.
func (w *world) routeFeed(in *initiator) {
	if in.silent {
		in.out = nil // its process is stopped: nothing leaves it (silent.go)
		return
	}
	for len(in.out) > 0 {
		o := in.out[0]
		in.out[0] = outMsg{}
		in.out = in.out[1:]
		w.routeOne(in, o.m, o.to)
	}
	in.out = nil
}

// routeOne delivers one message m the core sent to the nodes to.
func (w *world) routeOne(in *initiator, m wire.Message, to map[string]bool) {
	var inv partition.Invocation
	switch m := m.(type) {
	case *wire.Txn:
		inv = partition.Invocation{ID: m.ID, Proc: m.Proc, Params: m.Params}
	case *wire.Beat:
		inv = partition.Invocation{ID: m.ID}
		w.stats.Heartbeats++
		if m.ID.UnixMillis() > baseMillis+int64(w.tick)+in.skew {
			w.stats.BeatsAhead++
		}
	case *wire.Join:
		w.routeJoin(in, m.Partition, to)
		return
	default:
		panic(fmt.Sprintf("sim: i%d sent %v", in.id, m.Type()))
	}
	if to[oracleNode] {
		if err := offer(w.ref, inv); err != nil {
			w.violate("feed", "oracle refused %v: %v", inv.ID, err)
		}
	}
	for i, sr := range w.srcs {
		if to[sr.id] {
			in.toSrc[i].send(w, inv)
		}
	}
	if to[dstNode] {
		for _, a := range w.atts {
			if w.inFeed(a) {
				a.feed[in.idx].send(w, inv)
			}
		}
	}
	if txn, ok := m.(*wire.Txn); ok {
		// The oracle and the destination node read their feeds at once
		// and never lose them: each acknowledges what it read as a node
		// does, or the core's logs of those feeds, full, would refuse
		// every call (recovery.ErrFeedLogFull).
		for _, node := range [...]string{oracleNode, dstNode} {
			if to[node] {
				in.core.FeedAcked(node, txn.ID)
			}
		}
	}
}

// routeJoin delivers in's join of partition p (Knobs.Joins) to the nodes
// to. A source node takes it on its feed link, in order with the txns
// and heartbeats (joinSource). The oracle and the destination node take
// it at once: the oracle hears every initiator already (a joiner from
// its feed on), and the destination node's replica core tracks in from
// now on (an attempt running there takes it in, as a late feed's: its
// proposal waits for it, its handoff checks it heard it from E on). A
// heartbeat of in still in flight on an attempt's link then reaches a
// replica that tracks in, where on the node it would have come before
// the join and been read by none: no txn of p comes before the join's
// answer, so what it tells the attempt holds either way. Each answer
// (wire.Joined) comes back some ticks later (answerJoins).
func (w *world) routeJoin(in *initiator, p uint32, to map[string]bool) {
	if p != partitionID {
		panic(fmt.Sprintf("sim: i%d joined partition %d", in.id, p))
	}
	w.stats.Joins++
	if w.tr.on {
		w.tracef("i%d joins partition %d on %v", in.id, p, sortedNodes(to))
	}
	if to[oracleNode] {
		floor := txnid.Zero
		if in.joiner {
			floor = w.ref.LastExecuted()
		}
		w.answerJoin(in, oracleNode, floor)
	}
	for i, sr := range w.srcs {
		if to[sr.id] {
			in.toSrc[i].sendJoin(w)
		}
	}
	if to[dstNode] {
		floor := txnid.Zero
		if w.dst != nil {
			w.dst.AddInitiator(in.id)
			if a := w.dstAttempt(); a != nil {
				w.afterCall(a)
			}
			floor = w.dst.JoinFloor()
		}
		w.tracef("%s: i%d joined partition %d, floor %v", dstNode, in.id, p, floor)
		in.dstJoinTick = w.tick
		w.answerJoin(in, dstNode, floor)
	}
}

// joinSource is a source node reading in's join on l, as recovery/node's
// joinFeed does: its replica tracks in from now on, and the answer
// carries its floor, at least the last ID it took from in (a new
// process's IDs start above it). It goes back on the link with the acks,
// lost if the feed breaks first: the core asks again on the resumed feed.
func (w *world) joinSource(l *feedLink) {
	sr, in := l.src, l.in
	if sr.dead {
		return
	}
	sr.core.AddInitiator(in.id)
	sr.joined[in.idx] = true
	floor := max(sr.core.JoinFloor(), sr.tails.Last(in.id))
	w.tracef("%s: i%d joined partition %d, floor %v", sr.id, in.id, partitionID, floor)
	at := max(l.lastAck, w.tick+uint64(w.feedDraw(w.k.FeedAckDelayMax)))
	l.lastAck = at
	l.acks = append(l.acks, feedAck{at: at, join: true, id: floor})
}

// joinAnswer is a join's answer on its way back from the oracle or the
// destination node.
type joinAnswer struct {
	at    uint64
	in    *initiator
	node  string
	floor txnid.ID
}

func (w *world) answerJoin(in *initiator, node string, floor txnid.ID) {
	w.joinAnswers = append(w.joinAnswers, joinAnswer{at: w.tick + uint64(w.delay(w.k.FeedDelayMax)), in: in, node: node, floor: floor})
}

// answerJoins gives the initiators the answers due from the oracle and
// the destination node.
func (w *world) answerJoins() {
	for _, a := range takeDue(&w.joinAnswers, func(a joinAnswer) bool { return a.at <= w.tick }) {
		if a.in.silent {
			continue // a stopped process reads nothing
		}
		a.in.core.Joined(a.node, partitionID, a.floor)
		w.routeFeed(a.in)
	}
}

// sortedNodes lists the nodes of to in order, for the trace.
func sortedNodes(to map[string]bool) []string {
	return slices.Sorted(maps.Keys(to))
}
