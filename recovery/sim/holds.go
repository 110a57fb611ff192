package sim

import (
	"fmt"
	"slices"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/txnid"
)

// Holding a partition (docs/DESIGN.md "Holding a partition";
// recovery.Replica.Lose, recovery/node's lose). A source replica that may
// lack txns its partition acknowledged elsewhere (its lapse's settlement
// fails it, a resumed feed's hello names the partition missed, a feed is
// re-opened without resuming, its tail of a fenced initiator cannot be
// repaired) fails if another replica of the partition is live in the
// node's view, to be rebuilt from it, and is held otherwise: it keeps its
// content and runs nothing. The run models neither what ends a hold (a
// rejoin from a replica that comes back, an admin's accept-loss) nor the
// rejoin of a failed replica, so a held replica, like a failed one, is
// out of the run for good; a partition whose only replicas left are held
// ends the run there, the expected end of a run that lost every other.
//
// The oracle counts the txns a held replica lacks that another replica
// ran (Stats.HeldLacking): those are the txns that may have been
// acknowledged without it (the run has no caller to say which were).

// holdRecord is a held replica as it stood at its hold: it runs nothing
// after, so it stands so at the end (invariant f).
type holdRecord struct {
	tick   uint64
	last   txnid.ID
	digest uint64
	rows   []int
	// took: how many txns its core had taken in (srcReplica.took).
	took int
}

// liveElsewhere is the node's question before it fails or holds a
// replica of the partition (recovery/node's liveElsewhere): is a replica
// of it on another node live in the view? The view is the coordinator's:
// a replica record that says live, of a node whose registration stands.
// A dead node's replica counts until its record goes, as in the node's.
func (w *world) liveElsewhere(node string) bool {
	return slices.ContainsFunc(w.coord.replicas, func(r supervise.Replica) bool {
		_, registered := w.coord.nodes[r.Node]
		return r.Node != node && registered && r.State == recovery.ReplicaLive
	})
}

// liveInRun is invariant (f)'s own look at the same question, from the
// replicas rather than their records: another source node's core live
// while its registration stands (its node may have died: the view cannot
// know it before its record goes), or the destination node's replica
// live once the coordinator knows it is (its completion written: before
// that no view has it). It differs from liveElsewhere where a record
// does not follow its replica.
func (w *world) liveInRun(node string) []string {
	var live []string
	for _, o := range w.srcs {
		if _, registered := w.coord.nodes[o.id]; o.id != node && registered && o.core.State() == recovery.ReplicaLive {
			live = append(live, o.id)
		}
	}
	if w.live != nil && w.dst.State() == recovery.ReplicaLive && w.coord.replicas[len(w.coord.replicas)-1].State == recovery.ReplicaLive {
		live = append(live, dstNode)
	}
	return live
}

// loseSource is sr's replica found to lack txns its partition may have
// acknowledged elsewhere: recovery.Replica.Lose, with the view's answer
// on whether another replica is live. A held replica lost again stays
// held, or fails if one is live now.
func (w *world) loseSource(sr *srcReplica, why string) {
	if sr.failed || sr.dead {
		return
	}
	others := w.liveElsewhere(sr.id)
	if w.opts.Sabotage == SabotageHoldAlways {
		others = false
	}
	wasHeld := sr.held
	w.callOut(sr, func() { sr.core.Lose(why, others) })
	live := w.liveInRun(sr.id)
	switch st := sr.core.State(); {
	case st == recovery.ReplicaHeld && len(live) > 0:
		w.violate("f", "%s's replica held (%s) while %v live in the view: it must fail, to be rebuilt", sr.id, why, live)
	case st == recovery.ReplicaNeedsRejoin && len(live) == 0:
		w.violate("f", "%s's replica failed (%s) with no other replica of the partition live in the view: its rows are the partition's last", sr.id, why)
	case st == recovery.ReplicaHeld && wasHeld:
		w.tracef("%s node: replica stays held: %s", sr.id, why)
	case st == recovery.ReplicaHeld:
		w.hold(sr, why)
	case st == recovery.ReplicaNeedsRejoin:
		if wasHeld {
			w.stats.HeldFailed++
		}
		w.outSource(sr, why, false)
	default:
		w.violate("f", "%s's replica is %s after it was lost (%s)", sr.id, st, why)
	}
}

// hold records sr's replica held: out of the run, its content kept as
// it stands now.
func (w *world) hold(sr *srcReplica, why string) {
	if sr.core.Executing() || sr.core.Source() != nil || sr.core.Held() != why {
		w.violate("f", "%s's replica held (%s) takes in its feed (%v), serves a source (%v) or says it is held for %q", sr.id, why, sr.core.Executing(), sr.core.Source() != nil, sr.core.Held())
	}
	p := sr.exec.Partition()
	sr.hold = &holdRecord{tick: w.tick, last: sr.exec.LastExecuted(), digest: p.Digest(), rows: rowCounts(p), took: len(sr.took)}
	w.stats.Held++
	w.outSource(sr, why, true)
}

// stranded reports whether the partition has no live replica and none
// that can become live in the run: every source replica out (dead,
// failed, held), one of them held, and no destination live.
func (w *world) stranded() bool {
	if w.live != nil {
		return false
	}
	held := false
	for _, sr := range w.srcs {
		if !sr.out() {
			return false
		}
		held = held || sr.held
	}
	return held
}

// checkHolds checks that every held replica ran and took nothing since
// its hold, and is held still.
func (w *world) checkHolds(when string) {
	for _, sr := range w.srcs {
		h := sr.hold
		if !sr.held || h == nil {
			continue
		}
		p := sr.exec.Partition()
		if d, r, rows := p.Digest(), recompute(p), rowCounts(p); sr.exec.LastExecuted() != h.last || d != h.digest || r != d || !slices.Equal(rows, h.rows) || len(sr.took) != h.took {
			w.violate("f", "%s: %s's replica, held at tick %d at %v (digest %016x, rows %v, %d txns taken in), is at %v (digest %016x, recomputed %016x, rows %v, %d taken in)",
				when, sr.id, h.tick, h.last, h.digest, h.rows, h.took, sr.exec.LastExecuted(), d, r, rows, len(sr.took))
		}
		if sr.core.State() != recovery.ReplicaHeld {
			w.violate("f", "%s: %s's replica, held at tick %d, is %s", when, sr.id, h.tick, sr.core.State())
		}
	}
}

// countHolds adds to Stats.HeldLacking what each replica held at the
// end lacks.
func (w *world) countHolds() {
	for _, sr := range w.srcs {
		if sr.held {
			n := w.lacking(sr)
			w.stats.HeldLacking += n
			w.tracef("%s node: its held replica, at %v, lacks %d txns another replica ran (each may have been acknowledged)", sr.id, sr.hold.last, n)
		}
	}
}

// lacking counts the txns another replica of the partition ran that
// held sr did not: a source's, those it took in up to its last (it runs
// them in ID order), dead or out since; a live destination's, what its
// source took in below E and what it took in itself from E to its last.
func (w *world) lacking(sr *srcReplica) int {
	ran := map[txnid.ID]bool{}
	add := func(ids []txnid.ID, from, to txnid.ID) {
		for _, id := range ids {
			if id >= from && id <= to {
				ran[id] = true
			}
		}
	}
	for _, o := range w.srcs {
		if o != sr {
			add(o.took, txnid.Zero, o.exec.LastExecuted())
		}
	}
	if a := w.live; a != nil {
		add(a.sn.took, txnid.Zero, a.e-1)
		add(w.dstTook, a.e, a.exec.LastExecuted())
	}
	for _, id := range sr.took {
		if id <= sr.hold.last {
			delete(ran, id)
		}
	}
	return len(ran)
}

// noteTook records a txn node's replica core took in, for lacking.
func (w *world) noteTook(node string, inv partition.Invocation) {
	if inv.Proc == "" {
		return
	}
	if sr := w.srcNamed(node); sr != nil {
		sr.took = append(sr.took, inv.ID)
		return
	}
	w.dstTook = append(w.dstTook, inv.ID)
}

// heldSummary names the held replicas, for the end's trace.
func (w *world) heldSummary() string {
	var s []string
	for _, sr := range w.srcs {
		if sr.held {
			s = append(s, fmt.Sprintf("%s at %v", sr.id, sr.hold.last))
		}
	}
	return fmt.Sprint(s)
}
