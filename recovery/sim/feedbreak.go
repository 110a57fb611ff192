package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/txnid"
)

// Feeds that break and resume (docs/DESIGN.md "Feeds that resume";
// recovery/node's feed.go). An initiator's feed to a source node breaks
// like a TCP connection: what was in flight on it is lost, and so are the
// acks on their way back. The initiator's core keeps in the feed's log
// every txn the node has not acknowledged and logs the ones it sequences
// meanwhile; the node's replica goes on tracking the initiator and stalls
// where its feed stopped. For a while the node is out of reach (its dials
// fail); then a redial, answered some ticks later, asks to resume, and
// the node answers by serveFeed's rule (takeUp): resumed at the last ID
// it read, the core resending the log above it, or refused, its replica
// failed. The oracle heard every txn when it was sequenced, so a resend
// that left a hole shows as a replica unequal to it (invariant a), or one
// that never reaches the last txn (c).

// feedBreak is a planned break of a feed to a source node outside a
// lost registration: at the first tick from at at which initiator in's
// feed to source src is open.
type feedBreak struct {
	at      uint64
	in, src int
}

// pendingDial is a redial on its way to a source node: its hello, and the
// tick its answer comes back.
type pendingDial struct {
	ask recovery.DialAsk
	at  uint64
}

// planFeedBreaks draws the run's breaks outside a lost registration from
// the feed stream: the same number of draws whatever they give.
func (w *world) planFeedBreaks() {
	for range w.k.FeedBreaks {
		b := feedBreak{at: uint64(w.k.StartTick + w.feedRng.IntN(w.k.WorkloadTicks+200))}
		b.in, b.src = w.feedRng.IntN(w.k.Initiators), w.feedRng.IntN(w.k.Sources)
		w.feedBreaks = append(w.feedBreaks, b)
	}
}

// feedDraw draws 0..n from the feed stream; a script has none and draws 0.
func (w *world) feedDraw(n int) int {
	if w.feedRng == nil || n <= 0 {
		return 0
	}
	return w.feedRng.IntN(n + 1)
}

// feedGap draws how long a broken feed's node stays out of reach.
func (w *world) feedGap() uint64 { return uint64(1 + w.feedDraw(w.k.FeedGapTicksMax-1)) }

// breaking reports whether a feed into sr is broken, or being redialled:
// its replica may yet fail.
func (sr *srcReplica) breaking() bool {
	return slices.Contains(sr.broke, true) || slices.ContainsFunc(sr.dialing, func(d *pendingDial) bool { return d != nil })
}

// othersSound reports whether every source replica but sr is live, settled
// and fed whole: sr's may then fail and one still lives on.
func (w *world) othersSound(sr *srcReplica) bool {
	for _, o := range w.srcs {
		if o != sr && (o.out() || o.unsettled() || o.breaking()) {
			return false
		}
	}
	return true
}

// linkTo is in's feed link to sr.
func (in *initiator) linkTo(sr *srcReplica) *feedLink {
	for _, l := range in.toSrc {
		if l.src == sr {
			return l
		}
	}
	panic(fmt.Sprintf("sim: i%d has no link to %s", in.id, sr.id))
}

// srcNamed is the source replica on node, or nil.
func (w *world) srcNamed(node string) *srcReplica {
	for _, sr := range w.srcs {
		if sr.id == node {
			return sr
		}
	}
	return nil
}

// untilRedial is the gap of a script's break: the node is out of reach
// until the script redials it.
const untilRedial = math.MaxUint64 / 2

// breakFeed breaks in's open feed to sr: what is in flight either way is
// lost, the core logs what it sequences for the node from now on, and
// the node is out of reach for gap ticks.
func (w *world) breakFeed(in *initiator, sr *srcReplica, gap uint64) {
	w.breakLink(in, sr, gap, true)
}

// closedBySender is in's core closing its open feed to node in an input
// other than a resume (its log full, the node taken for dead: Submit):
// the core knows the feed lost; what is in flight is lost, and the node
// is in reach for the redial the core makes once its view has the node.
func (w *world) closedBySender(in *initiator, node string) {
	sr := w.srcNamed(node)
	if sr == nil {
		w.violate("c", "i%d's core closed its feed to %s, which never breaks", in.id, node)
		return
	}
	w.tracef("i%d: closes its feed to %s (its log full, the node out of its view)", in.id, node)
	w.breakLink(in, sr, 0, false)
}

// breakLink is breakFeed, telling the core of it if lost says so.
func (w *world) breakLink(in *initiator, sr *srcReplica, gap uint64, lost bool) {
	l := in.linkTo(sr)
	items, txns := len(l.q), 0
	for _, it := range l.q {
		if it.inv.Proc != "" {
			txns++
		}
	}
	l.q, l.acks = nil, nil
	if lost {
		in.core.FeedLost(sr.id)
	}
	sr.broke[in.idx] = true
	sr.redialAt[in.idx] = w.tick + gap
	sr.gapTxns[in.idx] += txns
	sr.brokeAt = w.tick
	for _, a := range w.atts {
		if a.sn == sr && (a.src == nil || !a.src.State().Final()) {
			a.feedBreaks++
		}
	}
	w.stats.FeedsBroken++
	w.stats.FeedItemsLost += items
	reach := fmt.Sprintf("out of reach for %d ticks", gap)
	if gap >= untilRedial {
		reach = "out of reach until redialled"
	}
	w.tracef("i%d: feed to %s breaks: %d in flight lost (%d txns), %s read up to %v, log %d B; %s",
		in.id, sr.id, items, txns, sr.id, sr.recv[in.idx], in.core.LogBytes(sr.id), reach)
}

// stepFeeds is a tick of the feeds to the source nodes: acks that arrive,
// planned breaks that fire, broken feeds redialled once their node is in
// reach, redials answered.
func (w *world) stepFeeds() {
	for _, in := range w.inits {
		if in.silent {
			continue // a stopped process reads nothing
		}
		for _, l := range in.toSrc {
			l.takeAcks(w)
		}
	}
	w.answerJoins()
	kept := w.feedBreaks[:0]
	for _, b := range w.feedBreaks {
		in, sr := w.inits[b.in], w.srcs[b.src]
		if w.tick < b.at || !in.core.Fed(sr.id) || sr.out() || !w.othersSound(sr) || in.silent {
			kept = append(kept, b)
			continue
		}
		w.feedBreaksFired++
		w.breakFeed(in, sr, w.feedGap())
	}
	w.feedBreaks = kept
	for _, in := range w.inits {
		if in.joiner && !in.active || in.silent {
			continue
		}
		redial := false
		for _, sr := range w.srcs {
			if d := sr.dialing[in.idx]; d != nil && w.tick >= d.at {
				sr.dialing[in.idx] = nil
				w.answerDial(in, sr.id, d.ask)
				continue
			}
			_, inView := w.view.Nodes[sr.id]
			if sr.broke[in.idx] && sr.dialing[in.idx] == nil && !sr.dead && inView && w.tick >= sr.redialAt[in.idx] && !in.core.Fed(sr.id) {
				redial = true
			}
		}
		if redial {
			w.dial(in)
		}
	}
}

// takeUp is a source node's answer to the hello of a feed from a process
// whose feed there broke, by recovery/node's serveFeed rule: it resumes
// if the hello asks to, the replica still tracks the initiator, and it
// read the old feed up to where the initiator's log starts (Kept), and
// then fails the replica if the hello names its partition missed (txns
// the initiator sent nowhere while the node was out of its view).
// Otherwise the replica fails: what was sent meanwhile never arrives.
// why is the replica's failure, or "".
func (w *world) takeUp(sr *srcReplica, in *initiator, d recovery.DialAsk) (resume bool, why string) {
	at := sr.recv[in.idx]
	switch {
	case !d.Resume:
		return false, fmt.Sprintf("feed from initiator %d re-opened by the same process without resuming: txns sent meanwhile were not received", in.id)
	case sr.joined[in.idx] && !sr.core.Tracks(in.id):
		return false, fmt.Sprintf("feed from initiator %d re-opened by the same process after its replica here stopped tracking it", in.id)
	case at < d.Kept:
		return false, fmt.Sprintf("feed from initiator %d re-opened by the same process, which no longer holds what this node missed (it stopped at %v, the sender keeps above %v)", in.id, at, d.Kept)
	case slices.Contains(d.Missed, partitionID):
		return true, fmt.Sprintf("initiator %d sequenced txns of partition %d while this node was out of its view", in.id, partitionID)
	}
	return true, ""
}

// resumeFeed is the source node sr taking up in's broken feed at the last
// ID it read: the core resends its log above it, which the world routes.
func (w *world) resumeFeed(in *initiator, sr *srcReplica, why string) {
	at := sr.recv[in.idx]
	w.stats.FeedsResumed++
	if sr.gapTxns[in.idx] > 0 {
		w.stats.GapsFilled++
	}
	sr.gapTxns[in.idx] = 0
	w.tracef("i%d: feed to %s resumes at %v", in.id, sr.id, at)
	in.feeds.closes, in.feeds.resuming = nil, sr.id
	in.core.FeedResumed(sr.id, at)
	in.feeds.resuming = ""
	if slices.Contains(in.feeds.closes, sr.id) {
		// A txn was missed there (its log full) while the dial was out:
		// the core closes the feed, and its next hello names the
		// partition. The node took the feed up all the same, failing
		// what this hello named (serveFeed does before anything comes),
		// and the core redials within a view's poll: the node is in
		// reach.
		in.feeds.closes = nil
		w.stats.ResumesClosed++
		w.tracef("i%d: feed to %s closed at once: a txn was missed there while the dial was out", in.id, sr.id)
		if why != "" {
			w.stats.FailedOnResumeMissed++
			w.loseSource(sr, why)
		}
		w.breakFeed(in, sr, 1)
		return
	}
	if why != "" {
		// Before it reads anything of the feed, as serveFeed does: a
		// held replica takes in none of the resend.
		w.stats.FailedOnResumeMissed++
		w.loseSource(sr, why)
	}
	resent := 0
	for _, o := range in.out {
		if o.to[sr.id] {
			resent++
		}
	}
	w.stats.TxnsResent += resent
	if resent > 0 {
		w.tracef("i%d: resends %d txns to %s", in.id, resent, sr.id)
	}
	w.routeFeed(in)
}

// refusedJoining reports whether err is in's core refusing a txn of the
// workload while its join of the partition is not answered on every
// feed yet (Knobs.Joins): a definite failure, nothing sent.
func (w *world) refusedJoining(in *initiator, err error) bool {
	var unfed *recovery.UnfedError
	if !errors.As(err, &unfed) || !unfed.Joining {
		return false
	}
	w.stats.RefusedJoining++
	w.tracef("i%d: txn refused: %v", in.id, err)
	return true
}

// refusedNoLive reports whether err is in's core refusing a txn of the
// workload because no replica it may count on would take it: none is
// live in its view (the only live source node out of the view, its
// registration lapsed, the other dead or failed: registration.go's alone
// plan), or the feeds to the live ones are broken with their logs full
// (recovery.ErrFeedLogFull). A definite failure, not a bug, when the
// view has indeed no live replica, or the core says its logs are full.
func (w *world) refusedNoLive(in *initiator, err error) bool {
	switch {
	case errors.Is(err, recovery.ErrFeedLogFull):
		w.stats.RefusedLogFull++
	case errors.Is(err, recovery.ErrNoLiveReplica) && !slices.ContainsFunc(w.view.Placement[partitionID], func(rp recovery.ReplicaPlace) bool { return rp.Live }):
		w.stats.RefusedNoLive++
	default:
		return false
	}
	w.tracef("i%d: txn refused: %v", in.id, err)
	return true
}

// refusedRedialing reports whether err is in's core refusing a txn of
// the workload for a feed it redials to a node out of its view: its
// hello named what was missed until then, so nothing more may be
// sequenced unsent until the answer (recovery.Unfed, Dialing). A
// definite failure, not a bug; any other refusal is.
func (w *world) refusedRedialing(in *initiator, err error) bool {
	var unfed *recovery.UnfedError
	if !errors.As(err, &unfed) {
		return false
	}
	for _, node := range unfed.Nodes {
		if sr := w.srcNamed(node); sr == nil || sr.dialing[in.idx] == nil {
			return false
		}
	}
	w.stats.RefusedRedialing++
	w.tracef("i%d: txn refused: %v", in.id, err)
	return true
}

// readFeed records what sr's node read on in's feed, and acknowledges it
// as the node's feed writer does (wire.FeedAck): not after every item
// while more are there to read, and late, drawn from the feed stream, so
// a log is sometimes long when its feed breaks. The last item read is
// always acknowledged, as the node's writer does at its flush: an open
// feed's full log refuses calls (recovery.ErrFeedLogFull) until its node
// acknowledges, and one never acknowledged would refuse them for good.
func (w *world) readFeed(l *feedLink, id txnid.ID) {
	sr, in := l.src, l.in
	sr.recv[in.idx] = max(sr.recv[in.idx], id)
	if l.due(w.tick) && w.k.FeedAckPct < 100 && w.feedDraw(99) >= w.k.FeedAckPct {
		return
	}
	at := max(l.lastAck, w.tick+uint64(w.feedDraw(w.k.FeedAckDelayMax)))
	if at <= w.tick && len(l.acks) == 0 {
		in.core.FeedAcked(sr.id, sr.recv[in.idx])
		return
	}
	l.lastAck = at
	l.acks = append(l.acks, feedAck{at: at, id: sr.recv[in.idx]})
}

// feedAck is an acknowledgement on its way back to an initiator, or with
// join, the answer to its join (wire.Joined) with the floor id: the node
// writes both on one queue.
type feedAck struct {
	at   uint64
	id   txnid.ID
	join bool
}

// takeAcks gives l's initiator the acks and join answers due: they come
// back in order.
func (l *feedLink) takeAcks(w *world) {
	for len(l.acks) > 0 && l.acks[0].at <= w.tick {
		if a := l.acks[0]; a.join {
			l.in.core.Joined(l.src.id, partitionID, a.id)
		} else {
			l.in.core.FeedAcked(l.src.id, a.id)
		}
		l.acks = l.acks[1:]
	}
	if len(l.acks) == 0 {
		l.acks = nil
	}
}
