package supervise

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// The fence loop's decisions, pure (docs/DESIGN.md "Fencing by the
// peers' word", "A cut between two nodes", "A process that starts cut
// off"): which fence a node tries, and whether a process not registered
// may register. recovery/node drives them with etcd and its feeds; the
// simulator's fencing model (recovery/sim) with its own reachability,
// so that a rule changed here is one the seeds try.

// FenceView is what a node's fence loop reads of one membership: the
// registered nodes, the fences a majority backs (FencesDue), and the
// cut's picks (CutPlan), the first of which is CutDue's.
type FenceView struct {
	Nodes map[string]NodeRecord
	Due   []Due
	Cut   []Due
}

// NewFenceView reads m's fences due. The view is a copy: m may change
// under the node's watch while the fence loop reads it.
func NewFenceView(m *Membership) FenceView {
	return FenceView{Nodes: maps.Clone(m.Nodes), Due: FencesDue(m), Cut: CutPlan(m)}
}

// ProcessOf is rec's process, as reports name it: its Started in Unix
// nanoseconds.
func ProcessOf(rec NodeRecord) int64 { return rec.Started.UnixNano() }

// Fencer is one node's fence loop between rounds: since when each
// process has been among the cut's picks in its views, and when it last
// tried to fence each node. The zero value is not ready: NewFencer.
type Fencer struct {
	self string
	// cutAfter is how long a process stays among the cut's picks in this
	// node's views before it fences it; tryEvery bounds how often it
	// tries to fence one node.
	cutAfter, tryEvery time.Duration
	noCut              bool
	since              map[string]time.Time // node@inc → first seen among the picks
	tried              map[string]time.Time // node → last tried
}

// NewFencer is node self's fence loop. noCut leaves the cut's fence out
// (a test's knob: what a standing cut does without it).
func NewFencer(self string, cutAfter, tryEvery time.Duration, noCut bool) *Fencer {
	return &Fencer{self: self, cutAfter: cutAfter, tryEvery: tryEvery, noCut: noCut,
		since: map[string]time.Time{}, tried: map[string]time.Time{}}
}

// FenceTry is a fence a round tries: Cut says it is the cut's pick, not
// a majority's.
type FenceTry struct {
	Due
	Cut bool
}

// Next is a round of the loop at now, on view v, while this node
// suspects the processes suspects (node → incarnation): the fences to
// try, in order, until one passes. Each majority fence due; or, with
// none due, the cut's first pick once it has stood among the picks for
// cutAfter here; each only if this node is among its reporters and
// suspects the very process reported, at most every tryEvery per node.
// The caller calls Tried for each it tries.
//
// The wait is on the picks, not on the reports: the reports of one
// fault come in over a loop or two of each reporter, and picked on the
// first of them, a 2|3 split fenced a node of the three before the rest
// came in and a majority fenced the two. Counted from a report on the
// pick, a cut standing while a node was out turned due the moment it
// registered, and fell on the wrong side before its report came (the
// fencing model, seed 1271: four nodes, n4 back to fence n1, and n1
// fenced n3 and n4 in turn). Counted from when the pick entered the
// plan, the picks after the first wait no longer than it: a bridge's
// second side goes as soon as the first.
func (f *Fencer) Next(now time.Time, v FenceView, suspects map[string]int64) []FenceTry {
	planned := map[string]bool{}
	for _, d := range v.Cut {
		key := fmt.Sprintf("%s@%d", d.Node, ProcessOf(v.Nodes[d.Node]))
		planned[key] = true
		if _, ok := f.since[key]; !ok {
			f.since[key] = now
		}
	}
	for key := range f.since {
		if !planned[key] {
			delete(f.since, key)
		}
	}
	var out []FenceTry
	for _, d := range v.Due {
		if f.mayTry(now, v, d, suspects) {
			out = append(out, FenceTry{Due: d})
		}
	}
	if len(v.Due) > 0 || len(v.Cut) == 0 || f.noCut {
		return out
	}
	pick := v.Cut[0]
	since := f.since[fmt.Sprintf("%s@%d", pick.Node, ProcessOf(v.Nodes[pick.Node]))]
	if now.Sub(since) >= f.cutAfter && f.mayTry(now, v, pick, suspects) {
		out = append(out, FenceTry{Due: pick, Cut: true})
	}
	return out
}

// Tried notes a try of node's fence at now.
func (f *Fencer) Tried(now time.Time, node string) { f.tried[node] = now }

func (f *Fencer) mayTry(now time.Time, v FenceView, d Due, suspects map[string]int64) bool {
	rec, ok := v.Nodes[d.Node]
	if !ok || d.Node == f.self || !slices.Contains(d.Reporters, f.self) {
		return false
	}
	if inc, ok := suspects[d.Node]; !ok || inc != ProcessOf(rec) {
		return false
	}
	last, ok := f.tried[d.Node]
	return !ok || now.Sub(last) >= f.tryEvery
}

// Gate is MayRegister's answer: Why it may register, and Report, the
// nodes it does not reach whose fence its report completes, which it
// reports as soon as it is registered: its word is what the gate counted
// on. Waiting out a silence first (suspectAfter from its registration),
// it left the cut standing between those nodes and its own side that
// long, and the cut's fence picked by the reports already in, on the
// wrong side: four nodes, n4 back beside n2 and n3, which a cut kept
// from n1, registered to fence n1; before its report came, n1 and n3
// reported each other alone, and n1 fenced n3, the greater id, then n4,
// and n3 came back the same way (the simulator's fencing model, seed
// 1271).
type Gate struct {
	Why    string
	Report []string
}

// MayRegister decides whether node id, not registered, may register
// while it reaches the live nodes fed (a feed open, or a HelloReach
// answered) and not those of unfed, in m (nil: not read yet): it reaches
// them all; or the nodes it reaches are, with it, a majority of the
// cluster, and its own report completes the fence of each of the rest
// (DueOnceReported), which it is to report at once (Gate.Report). It
// says why it may, or why not. noCut is the Fencer's: without the cut's
// fence, a majority reached is enough.
//
// A majority reached is not enough: a node it cannot reach that fewer
// report is a cut between the two (DESIGN "A cut between two nodes"),
// and registered across it, the two report each other and one is fenced
// again. Among five, n2 cut from n1 alone, fenced for it, registered again
// and was fenced six times in 8 s (TestCutLinkFencedStaysOut); and a node
// fenced for one side of a bridge, back in on the word of a node of its
// own side that reported the other, turned the next fence onto the other
// side (rejoin chaos --net-faults on --seed 20261210, +8.5 s).
func MayRegister(m *Membership, id string, fed, unfed []string, noCut bool) (Gate, error) {
	unfed = slices.Sorted(slices.Values(unfed))
	others := len(unfed) + len(fed)
	switch {
	case len(unfed) == 0:
		return Gate{Why: "it reaches every live node"}, nil
	case m != nil && DueOnceReported(m, id, fed, unfed):
		return Gate{Why: fmt.Sprintf("the nodes it reaches are a majority of the cluster, and its report completes the fence of each it does not (%v)", unfed),
			Report: unfed}, nil
	case 2*len(fed) <= others:
		return Gate{}, fmt.Errorf("it reaches %d of %d live nodes, not a majority (not %v)", len(fed), others, unfed)
	case noCut:
		return Gate{Why: "it reaches a majority of the live nodes"}, nil
	}
	return Gate{}, fmt.Errorf("it does not reach %v, and its report would not complete their fence: a cut between it and them", unfed)
}
