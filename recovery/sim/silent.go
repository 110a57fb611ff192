package sim

import (
	"fmt"
	"slices"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
)

// A silent initiator fenced (docs/DESIGN.md "Fencing by the peers' word";
// recovery/node's fence.go and repair.go). An initiator's process stops
// (paused, cut off) with its feeds open: nothing more of it arrives, and
// every replica, which runs a txn only once each initiator it tracks has
// sent past it, holds. Its last txns may have reached some replicas and
// not others. Once the cluster takes the process for dead, each replica
// repairs its tail of the initiator from its live peers by the product's
// rules (recovery.TailRepair for whom to ask and when the replica fails,
// recovery.Tails for what each replica kept), so that every survivor
// holds the longest prefix any survivor got, and only then stops waiting
// for it. The oracle heard every txn when it was sequenced: a repair that
// left a survivor short shows as a replica unequal to it.

// silence stops in's process: nothing more of it leaves, but what it had
// sent to the source nodes in reach arrives first; what was on its way to
// the others is lost with the connections, and so is what was on its way
// to the destination node unless dstReach.
func (w *world) silence(in *initiator, reach []string, dstReach bool) {
	for _, l := range in.toSrc {
		if slices.Contains(reach, l.src.id) {
			for len(l.q) > 0 {
				l.deliver(w)
			}
			continue
		}
		if n := len(l.q); n > 0 {
			w.tracef("i%d: %d of its messages to %s lost", in.id, n, l.src.id)
		}
		l.q = nil
	}
	if !dstReach {
		for _, a := range w.atts {
			if a.feed == nil {
				continue
			}
			if l := a.feed[in.idx]; len(l.q) > 0 {
				w.tracef("i%d: %d of its messages to %s (attempt %d) lost", in.id, len(l.q), dstNode, a.epoch)
				l.q = nil
			}
		}
	}
	in.silent = true
	w.tracef("i%d: process silent, its feeds open", in.id)
}

// silencePlan is a seeded run's silence: from tick at, once in's feeds
// into the live source nodes are all sound, in's process goes silent for
// ticks, then the cluster fences it.
type silencePlan struct {
	at, ticks uint64
	in        int
	// fenceAt: the tick of the fence, once silent (0: not yet).
	fenceAt uint64
	done    bool
}

// planSilences draws the run's silences from their stream: the same
// draws whatever they give. A silenced initiator never comes back (a
// fenced process is a new one when it does), so one other stays to run
// the workload; a lost registration's settlement would wait for the
// silent process's hello, and is left out.
func (w *world) planSilences() {
	r := w.silenceRng
	for range w.k.Silences {
		p := silencePlan{at: uint64(w.k.StartTick + r.IntN(max(1, w.k.WorkloadTicks))), in: r.IntN(max(1, w.k.Initiators)),
			ticks: uint64(1 + r.IntN(max(1, w.k.SilenceTicksMax)))}
		if w.k.Initiators >= 2 && !w.regPlan.on {
			w.silences = append(w.silences, p)
		}
	}
}

// stepSilences silences the initiators whose time has come and fences
// those silent long enough. What the silent one had in flight reaches a
// non-empty set of the live source nodes and is lost to the others, so
// that each of its txns, which the oracle heard when sequenced, is on a
// survivor; a silence waits while its feed into a live source node is
// broken or being redialled, whose log would die with it.
func (w *world) stepSilences() {
	for i := range w.silences {
		p := &w.silences[i]
		in := w.inits[p.in]
		switch {
		case p.done || w.tick < p.at:
		case p.fenceAt == 0:
			var live []string
			sound := true
			for _, sr := range w.srcs {
				if sr.dead || sr.out() {
					continue
				}
				live = append(live, sr.id)
				sound = sound && !sr.broke[in.idx] && sr.dialing[in.idx] == nil && in.core.Fed(sr.id)
			}
			if !sound || len(live) == 0 || w.quiescing {
				if !w.quiescing {
					continue // its feeds mend first
				}
				p.done = true
				w.stats.SilencesPutOff++
				continue
			}
			if w.tick < p.at+silenceMidSendTicks && !txnInFlight(in) {
				continue // the interesting silence is one mid-send
			}
			reach := live[:1+w.silenceRng.IntN(len(live))]
			if w.sourceMayDie() || w.k.FeedBreaks > 0 && w.k.FeedLogBytesMax > 0 || !w.othersSound(nil) {
				// Delivered to some nodes alone, a txn is lost if they all
				// die or fail, and the oracle, which heard it, no longer
				// matches the survivors: a txn lost with its initiator and
				// every replica that had it was never acknowledged, which
				// the oracle cannot tell. So it goes to every live node
				// when one may yet die (seed 7003702) or fail on a feed
				// that cannot resume, its log small enough to overflow
				// (seed 7004037).
				reach = live
			}
			w.silence(in, reach, w.silenceRng.IntN(2) == 0)
			for _, a := range w.atts {
				a.silenced = true
			}
			w.stats.Silenced++
			p.fenceAt = w.tick + p.ticks
		case w.tick >= p.fenceAt:
			p.done = true
			w.stats.Fenced++
			w.fenceInitiator(in)
		}
	}
}

// silenceMidSendTicks bounds how long a silence due waits for its
// initiator to have a txn on its way to a source node, so that its last
// txns reach some replicas and not others.
const silenceMidSendTicks = 50

// txnInFlight reports whether in has a txn on its way to a source node.
func txnInFlight(in *initiator) bool {
	for _, l := range in.toSrc {
		for _, it := range l.q {
			if it.inv.Proc != "" {
				return true
			}
		}
	}
	return false
}

// sourceMayDie reports whether a source node's death is planned and has
// not come yet.
func (w *world) sourceMayDie() bool {
	return slices.ContainsFunc(w.faults, func(f *fault) bool { return f.kind == faultSourceDies && !f.fired })
}

// silentNow reports whether an initiator's process is silent, not yet
// fenced, during a's run: a replica that tracks it holds, and a's
// processors may time out.
func (w *world) silentNow() bool {
	for _, in := range w.inits {
		if in.silent && !in.fenced {
			return true
		}
	}
	return false
}

// fenceInitiator takes silent in's process for dead: each live source
// replica repairs its tail of in from its peers, in placement order, then
// stops waiting for it, as the oracle does; so does the destination
// node's replica, live or rejoining, from the source nodes, and stops
// waiting for it too.
func (w *world) fenceInitiator(in *initiator) {
	var nodes []string
	for _, sr := range w.srcs {
		nodes = append(nodes, sr.id)
	}
	self := fmt.Sprintf("i%d", in.id) // an initiator runs on a node of its own
	for _, sr := range w.srcs {
		if sr.out() {
			continue
		}
		if why, fail := w.repairTail(in, recovery.NewTailRepair(in.id, nodes, sr.id, self), sr.id, sr.core, &sr.tails); fail {
			w.loseSource(sr, why)
			continue
		}
		sr.core.RemoveInitiator(in.id)
	}
	w.fenceAtDestination(in, nodes, self)
	w.ref.RemoveInitiator(in.id)
	in.fenced = true
	w.tracef("i%d: process taken for dead; its tail repaired, the replicas wait for it no more", in.id)
}

// repairTail is rep run for the replica core of node, whose tails are t:
// it asks the source nodes rep names, in turn, for in's txns past its
// prefix, takes them in, and returns rep's verdict.
func (w *world) repairTail(in *initiator, rep *recovery.TailRepair, node string, core *recovery.Replica, t *recovery.Tails) (why string, fail bool) {
	stat := &w.stats.TailTxnsRepaired
	if node == dstNode {
		stat = &w.stats.DstTailTxnsRepaired
	}
	for peer, ok := rep.Next(); ok; peer, ok = rep.Next() {
		p := w.srcNamed(peer)
		if p == nil || p.out() {
			rep.OnAnswer(peer, recovery.RepairTry{Err: fmt.Errorf("%s holds nothing that will run", peer)})
			continue
		}
		txns, err := p.tails.After(in.id, t.Last(in.id), 1)
		if err != nil {
			rep.OnAnswer(peer, recovery.RepairTry{Err: err, Gone: true, PeerAlive: true})
			continue
		}
		took := 0
		for _, inv := range txns {
			if inv.ID <= t.Last(in.id) {
				continue
			}
			if why := feedCore(core, inv); why != "" {
				w.violate("feed", "%s refused %v of i%d's repaired tail: %s", node, inv.ID, in.id, why)
			}
			keepTail(t, inv)
			w.noteTook(node, inv)
			took++
			*stat++
		}
		w.tracef("%s: i%d's prefix at %v; takes %d txns of it from %s", node, in.id, t.Last(in.id), took, peer)
		rep.OnAnswer(peer, recovery.RepairTry{PeerAlive: true})
	}
	return rep.Verdict()
}

// fenceAtDestination is fenceInitiator on the destination node's replica:
// executing (live, or buffering for an attempt), it repairs its tail of
// in from the source nodes as recovery/node's resolveInitiator does on
// every replica it hosts, then stops waiting for in; its attempt's
// proposal no longer waits for it, and what it heard of it stays
// (recovery.Coverage).
func (w *world) fenceAtDestination(in *initiator, nodes []string, self string) {
	// Its feed here is closed at the fence: what was still on its way
	// is not read (the repair brings it).
	for _, a := range w.atts {
		if a.feed != nil {
			a.feed[in.idx].q = nil
		}
	}
	if w.dst == nil || !w.dst.Tracks(in.id) {
		return
	}
	if w.dst.Executing() {
		rep := recovery.NewTailRepair(in.id, append(slices.Clone(nodes), dstNode), dstNode, self)
		if why, fail := w.repairTail(in, rep, dstNode, w.dst, &w.dstTails); fail {
			w.violate("feed", "%s: the repair of i%d's tail failed: %s", dstNode, in.id, why)
		}
	}
	w.dst.RemoveInitiator(in.id)
	if a := w.dstAttempt(); a != nil {
		w.afterCall(a)
	}
}

// keepTail records on sr's tails what its core took in from a feed.
func (sr *srcReplica) keepTail(inv partition.Invocation) { keepTail(&sr.tails, inv) }

// keepTail records on t what a replica core took in from a feed.
func keepTail(t *recovery.Tails, inv partition.Invocation) {
	if inv.Proc == "" {
		t.Took(inv.ID, nil, 1)
		return
	}
	t.Took(inv.ID, &inv, 1)
}
