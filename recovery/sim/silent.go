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
// the others is lost with the connections.
func (w *world) silence(in *initiator, reach []string) {
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
	in.silent = true
	w.tracef("i%d: process silent, its feeds open", in.id)
}

// fenceInitiator takes silent in's process for dead: each live source
// replica repairs its tail of in from its peers, in placement order, then
// stops waiting for it, as the oracle does.
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
		rep := recovery.NewTailRepair(in.id, nodes, sr.id, self)
		for peer, ok := rep.Next(); ok; peer, ok = rep.Next() {
			p := w.srcNamed(peer)
			if p.out() {
				rep.OnAnswer(peer, recovery.RepairTry{Err: fmt.Errorf("%s holds nothing that will run", peer)})
				continue
			}
			txns, err := p.tails.After(in.id, sr.tails.Last(in.id), 1)
			if err != nil {
				rep.OnAnswer(peer, recovery.RepairTry{Err: err, Gone: true, PeerAlive: true})
				continue
			}
			took := 0
			for _, inv := range txns {
				if inv.ID <= sr.tails.Last(in.id) {
					continue
				}
				if why := feedCore(sr.core, inv); why != "" {
					w.violate("feed", "%s refused %v of i%d's repaired tail: %s", sr.id, inv.ID, in.id, why)
				}
				sr.keepTail(inv)
				took++
			}
			w.tracef("%s: i%d's prefix at %v; takes %d txns of it from %s", sr.id, in.id, sr.tails.Last(in.id), took, peer)
			rep.OnAnswer(peer, recovery.RepairTry{PeerAlive: true})
		}
		if why, fail := rep.Verdict(); fail {
			sr.core.Fail(why)
			sr.failed = true
			w.tracef("%s node: replica failed: %s", sr.id, why)
			continue
		}
		sr.core.RemoveInitiator(in.id)
	}
	w.ref.RemoveInitiator(in.id)
	in.fenced = true
	w.tracef("i%d: process taken for dead; its tail repaired, the replicas wait for it no more", in.id)
}

// keepTail records on sr's tails what its core took in from a feed.
func (sr *srcReplica) keepTail(inv partition.Invocation) {
	if inv.Proc == "" {
		sr.tails.Took(inv.ID, nil, 1)
		return
	}
	sr.tails.Took(inv.ID, &inv, 1)
}
