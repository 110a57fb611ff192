package sim

import (
	"fmt"
	"slices"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/wire"
)

// The invariants, checked as the run goes (each names itself in a
// Violation):
//
//	(a) at the handoff the destination holds the source's content at E, as
//	    the simulator recorded it when the source sent Handoff (not as the
//	    message says), and the two stay equal at every common txn after it;
//	    the source stays equal to the oracle, which never took part;
//	(b) a source's change log never exceeded its bound;
//	(c) the run ends live within Faults+1 attempts (or held: f), every
//	    abort has a fault (or the supervisor) to explain it, after every
//	    ended source the source executor has no gate or stream left and
//	    runs everything its safe point allows (a held one: no gate or
//	    stream), and every aborted destination replica is empty and runs
//	    nothing;
//	(d) no running processor accepts a message of a superseded epoch;
//	(e) with claims: at each node, writes (messages other than Abort
//	    accepted by a running processor while their sender ran) are
//	    accepted in nondecreasing epoch order, so two holders that both
//	    believe they hold the claim never interleave their writes, and,
//	    with the lease guard, at no tick do both write, nor does a holder
//	    whose claim's lease ran out; a holder learns it lost its claim
//	    within one window (of the loss, or of waking from a pause) and its
//	    source writes nothing after it stops; a claim is created only when
//	    none stands (the coordinator's own invariant); a destination goes
//	    live at most once; at the end no claim is left and the task is
//	    done by the live attempt (not done, if the partition ended held);
//	(f) a replica lost for txns it may lack is held exactly when no other
//	    replica of its partition is live in the view, and once held runs
//	    and takes in nothing (holds.go).

// recompute sums partition.RowHash over every row, from scratch: the
// digest as the simulator sees it, independent of the running digest the
// partition keeps.
func recompute(p *partition.Partition) uint64 {
	var d uint64
	for _, t := range p.Tables() {
		for s := partition.Slot(0); s < t.SlotsLen(); s++ {
			if tu := t.Tuple(s); tu != nil {
				d += partition.RowHash(t.ID(), tu)
			}
		}
	}
	return d
}

func rowCounts(p *partition.Partition) []int {
	var n []int
	for _, t := range p.Tables() {
		n = append(n, t.Len())
	}
	return n
}

func (w *world) describeReplica(e *partition.Executor) string {
	p := e.Partition()
	if w.scripted {
		// Scripts compare digests rather than print them, so their golden
		// output does not change with the hash.
		return fmt.Sprintf("rows=%v last=%v", rowCounts(p), e.LastExecuted())
	}
	return fmt.Sprintf("rows=%v digest=%016x last=%v", rowCounts(p), p.Digest(), e.LastExecuted())
}

// hasGate and hasObserver: an ended source must leave neither behind
// (invariant c); behaviour alone shows only the gate.
func hasGate(e *partition.Executor) bool { return e.Gate() != nil }

func hasObserver(p *partition.Partition) bool { return p.Observer() != nil }

// checkReleased checks that no source processor holds sr's executor: no
// gate, no observer (so no table stream), and every txn the safe point
// allows runs.
func (w *world) checkReleased(sr *srcReplica, when string) {
	if sr.dead || sr.failed {
		return // its node and its processors are gone, or its replica failed
	}
	src := sr.exec
	if hasGate(src) {
		w.violate("c", "%s: the %s executor still has a gate", when, sr.id)
	}
	if hasObserver(src.Partition()) {
		w.violate("c", "%s: the %s partition still has an observer (a table stream)", when, sr.id)
	}
	if w.scripted || sr.held {
		return // a script runs the source itself, and shows what runs; a held replica runs nothing
	}
	for sr.core.Step(1<<16) > 0 {
	}
	if id, ok := src.Ready(); ok {
		w.violate("c", "%s: the source executor holds txn %v, which its safe point allows", when, id)
	}
}

// checkLogBound checks invariant (b) for a's source. The workload keeps
// every txn within the stream's per-txn reserve (txnLogBytesMax), so no
// txn may have gone over it and the log must never have passed
// ChangeLogBytesMax.
func (w *world) checkLogBound(a *attempt) {
	m := a.src.Metrics()
	if m.LogBytesPeak > w.k.ChangeLogBytesMax {
		w.violate("b", "source of attempt %d: change log peaked at %d bytes, bound %d", a.epoch, m.LogBytesPeak, w.k.ChangeLogBytesMax)
	}
	if m.Stream.TxnsOverReserve != 0 {
		w.violate("b", "source of attempt %d: %d txns added more than the per-txn reserve (largest %d bytes)", a.epoch, m.Stream.TxnsOverReserve, m.Stream.TxnBytesPeak)
	}
}

// checkEmpty checks that an aborted destination replica holds nothing and
// runs nothing.
func (w *world) checkEmpty(a *attempt) {
	p := a.exec.Partition()
	for _, t := range p.Tables() {
		if t.Len() != 0 {
			w.violate("c", "aborted destination replica of attempt %d keeps %d rows in %s", a.epoch, t.Len(), t.Schema().Name)
		}
	}
	if p.Digest() != 0 || recompute(p) != 0 {
		w.violate("c", "aborted destination replica of attempt %d: digest %016x, want 0", a.epoch, p.Digest())
	}
	if res, ok := a.exec.Step(); ok {
		w.violate("c", "aborted destination replica of attempt %d executed txn %v", a.epoch, res.ID)
	}
}

// checkLive checks invariant (a) at the moment the destination goes live.
func (w *world) checkLive(a *attempt) {
	h := a.handoff
	if h == nil {
		w.violate("a", "destination of attempt %d live with no Handoff sent by its source", a.epoch)
	}
	p := a.exec.Partition()
	if d, r, rows := p.Digest(), recompute(p), rowCounts(p); d != h.digest || r != h.recomputed || !slices.Equal(rows, h.rows) {
		w.violate("a", "destination of attempt %d live at E=%v with digest %016x (recomputed %016x, rows %v); the source had %016x (%016x, rows %v) when it sent Handoff",
			a.epoch, h.e, d, r, rows, h.digest, h.recomputed, h.rows)
	}
	if want := h.e - 1; a.exec.LastExecuted() != want {
		w.violate("a", "destination of attempt %d live at E=%v with last executed %v, want %v", a.epoch, h.e, a.exec.LastExecuted(), want)
	}
	w.live, w.liveTick = a, w.tick
	w.tracef("dst e%d live: %s (equal to the source at E)", a.epoch, w.describeReplica(a.exec))
	if w.opts.Sabotage == SabotageDestinationWrite {
		w.sabotage(a)
	}
}

// sabotage changes one row of the live destination replica behind the
// protocol's back: an increment of one row's n that no txn made.
func (w *world) sabotage(a *attempt) {
	for _, t := range a.exec.Partition().Tables() {
		for s := partition.Slot(0); s < t.SlotsLen(); s++ {
			if !t.Live(s) {
				continue
			}
			row, err := t.Row(s, nil)
			if err != nil {
				panic(err)
			}
			n := slices.IndexFunc(t.Schema().Columns, func(c partition.Column) bool { return c.Name == "n" })
			row[n] = wire.Int64(row[n].Int + 1)
			if err := t.Update(s, row); err != nil {
				panic(err)
			}
			w.tracef("SABOTAGE: row in slot %d of %s changed on the destination only", s, t.Schema().Name)
			return
		}
	}
}

// compare checks invariant (a) after the handoff whenever the live
// destination and its source have executed the same txns (or, its source
// dead, the oracle), and every live source against the oracle likewise.
func (w *world) compare() {
	if w.live != nil {
		src, what := w.live.sn.exec, "source"
		if sn := w.live.sn; sn.out() || sn.unsettled() {
			src, what = w.ref, "oracle"
		}
		if w.live.exec.LastExecuted() == src.LastExecuted() && src.LastExecuted() != w.lastCmp {
			w.lastCmp = src.LastExecuted()
			w.stats.DigestChecks++
			if a, b := src.Partition().Digest(), w.live.exec.Partition().Digest(); a != b {
				w.violate("a", "after the handoff at E=%v, at txn %v: %s digest %016x, destination %016x", w.live.e, src.LastExecuted(), what, a, b)
			}
		}
	}
	for i, sr := range w.srcs {
		src := sr.exec
		if sr.out() || sr.unsettled() || w.ref.LastExecuted() != src.LastExecuted() || src.LastExecuted() == w.lastRefCmp[i] {
			continue
		}
		w.lastRefCmp[i] = src.LastExecuted()
		if a, b := src.Partition().Digest(), w.ref.Partition().Digest(); a != b {
			w.violate("a", "at txn %v: %s digest %016x, oracle %016x: the rejoin changed the source", src.LastExecuted(), sr.id, a, b)
		}
	}
}

// finalCheck runs once every replica has executed the whole feed.
func (w *world) finalCheck() {
	w.checkHolds("at the end")
	w.countHolds()
	if w.live == nil {
		w.finalHeld()
		return
	}
	dst, ref := w.live.exec, w.ref
	for _, src := range w.liveSources() {
		if src.LastExecuted() != dst.LastExecuted() || src.LastExecuted() != ref.LastExecuted() {
			w.violate("a", "at the end: source at %v, destination at %v, oracle at %v", src.LastExecuted(), dst.LastExecuted(), ref.LastExecuted())
		}
		for _, e := range []*partition.Executor{dst, ref} {
			if d, r := e.Partition().Digest(), recompute(e.Partition()); d != src.Partition().Digest() || r != d {
				w.violate("a", "at the end, txn %v: source %s, %s (recomputed %016x)", src.LastExecuted(), w.describeReplica(src), w.describeReplica(e), r)
			}
		}
	}
	for _, sr := range w.srcs {
		w.checkReleased(sr, "at the end")
	}
	src := ref
	if w.claims {
		if c := &w.coord; c.claim != nil || c.task.Status != claim.StatusDone || c.task.Epoch != w.live.epoch {
			w.violate("e", "at the end, the coordinator holds %s; want no claim and the task done by epoch %d", c, w.live.epoch)
		}
		for _, a := range w.atts {
			if a.x != nil && a.x.holds {
				w.violate("e", "at the end, holder x%d still believes it holds epoch %d", a.x.id, a.epoch)
			}
		}
	}
	for _, a := range w.atts {
		if a.src != nil {
			w.checkLogBound(a)
		}
	}
	w.tracef("end: %d attempts, all replicas at %v: %s", len(w.atts), src.LastExecuted(), w.describeReplica(src))
}

// finalHeld is the final check of a run that ended with its partition
// held and no replica live (stranded): no attempt can have completed the
// task, and none may still believe it holds its claim, or hold it.
func (w *world) finalHeld() {
	if !w.stranded() {
		w.violate("c", "at the end, no destination live and the partition not held: %s", w.where())
	}
	for _, sr := range w.srcs {
		w.checkReleased(sr, "at the end")
	}
	if w.claims {
		if c := &w.coord; c.claim != nil || c.task.Status == claim.StatusDone {
			w.violate("e", "at the end, the partition held, the coordinator holds %s; want no claim and the task not done", c)
		}
		for _, a := range w.atts {
			if a.x != nil && a.x.holds {
				w.violate("e", "at the end, holder x%d still believes it holds epoch %d", a.x.id, a.epoch)
			}
		}
	}
	for _, a := range w.atts {
		if a.src != nil {
			w.checkLogBound(a)
		}
	}
	w.stats.HeldEnds++
	w.tracef("end: %d attempts, no replica live, the partition held on %v; the oracle at %v: %s", len(w.atts), w.heldSummary(), w.ref.LastExecuted(), w.describeReplica(w.ref))
}
