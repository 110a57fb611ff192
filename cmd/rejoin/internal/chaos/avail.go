package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Availability is how long the partitions went without a successful op
// while faults ran: for each partition, the longest gap between two
// successful completions (of the register workload and the volume
// writer) that overlaps the window of a network fault, a node stop or an
// etcd pause. A gap is "faulted" when a fault it overlaps (of any kind,
// kills included) hit one of the partition's replicas: it cut a link
// between two of its replicas' nodes or between one and etcd, or it
// killed or stopped one; else "unfaulted", and the partition should not
// have noticed.
//
// An etcd pause is no node's fault: every node loses its coordinator at
// once, and one longer than half a TTL ends every node's registration,
// so none sequences a call until etcd is back (docs/DESIGN.md "The way to
// a bounded fault"). Its span, and EtcdResumeAllowance after it, counts
// apart (MaxGapEtcd); the rest of a gap over it counts as any other gap,
// so service slow to come back after etcd does still counts.
//
// So does a span in which faults overlap on more nodes than a majority
// of the others can fence (more than (nodes-1)/2 of them killed,
// stopped or cut off at once): a node is taken for dead only on the word
// of a majority of the others (DESIGN "Fencing by the peers' word"), so
// a partition that waits for one of them waits until enough come back
// (MaxGapBeyond). What follows such a span counts as any gap, from its
// end: the cluster back within what it tolerates must serve within the
// bounds.
//
// A faulted gap is bounded from each fault's start, not whole: a fault
// that hits a replica is detected and fenced within a window, and the
// partition must serve again within it (GapBoundFaulted), before the next
// fault that hits it, or the gap's end. Two faults on two of a
// partition's replicas a second and a half apart (an isolated node, then
// a stopped one: chaos seed 354310367, +18.24s) each take their own
// window, and their gap, whole, is longer than either: it is kept, as
// MaxGapFaulted, and the bound applies to MaxWaitFaulted.
type Availability struct {
	// MaxGapFaulted and MaxGapUnfaulted are the longest gaps of each kind
	// over the partitions, in seconds (0: none of that kind).
	MaxGapFaulted   float64 `json:"max_gap_faulted_s"`
	MaxGapUnfaulted float64 `json:"max_gap_unfaulted_s"`
	// MaxWaitFaulted is the longest piece of a faulted gap between two
	// starts of faults that hit the partition (or the gap's own start or
	// end): how long the partition waited for service after a fault
	// began, what GapBoundFaulted bounds.
	MaxWaitFaulted float64 `json:"max_wait_faulted_s"`
	// MaxGapEtcd is the longest gap, whole, that overlapped an etcd pause
	// or the allowance after it; MaxGapBeyond the longest that overlapped
	// faults on more nodes than the cluster tolerates at once.
	MaxGapEtcd   float64 `json:"max_gap_etcd_pause_s"`
	MaxGapBeyond float64 `json:"max_gap_beyond_tolerance_s"`
	// Worst names the partition and the span of each longest gap.
	WorstFaulted     *Gap `json:"worst_faulted,omitempty"`
	WorstUnfaulted   *Gap `json:"worst_unfaulted,omitempty"`
	WorstWaitFaulted *Gap `json:"worst_wait_faulted,omitempty"`
	WorstEtcd        *Gap `json:"worst_etcd_pause,omitempty"`
	WorstBeyond      *Gap `json:"worst_beyond_tolerance,omitempty"`
	// Over lists the gaps past the bound of their kind (a faulted gap's
	// wait past GapBoundFaulted, an unfaulted gap past
	// GapBoundUnfaulted), longest wait first, at most overMax, each with the
	// faults over it: what a run's bounds would fail on, and why.
	Over []GapOver `json:"over,omitempty"`
	// Partitions has every partition's figures.
	Partitions []PartitionAvailability `json:"partitions,omitempty"`
	// Windows is how many fault windows were measured against.
	Windows int `json:"windows"`
}

// GapOver is a gap past its bound and the faults over it, each as
// "action +start..+end" (seconds from the workloads' start), marked
// "(hit)" when it hit the partition.
type GapOver struct {
	Gap
	Faulted bool `json:"faulted"`
	// Wait is the gap's longest wait from a fault's start (Availability),
	// the whole gap if unfaulted: what its bound applies to.
	Wait   float64  `json:"wait_s"`
	Faults []string `json:"faults"`
	// ProbeErrors are the partition's probe's failed calls within the
	// gap, by node and error (probes.failsIn): where the calls stopped.
	ProbeErrors []string `json:"probe_errors,omitempty"`
}

// overMax bounds Availability.Over.
const overMax = 20

// EtcdResumeAllowance is how long after an etcd pause a gap still counts
// as the pause's: a node tries to register again every quarter window
// (half a second at the default TTL) and then settles its lapse.
const EtcdResumeAllowance = time.Second

// PartitionAvailability is one partition's successful ops and its
// longest gaps, in seconds.
type PartitionAvailability struct {
	Partition       uint32  `json:"partition"`
	OKOps           int     `json:"ok_ops"`
	MaxGapFaulted   float64 `json:"max_gap_faulted_s"`
	MaxGapUnfaulted float64 `json:"max_gap_unfaulted_s"`
	MaxWaitFaulted  float64 `json:"max_wait_faulted_s"`
	MaxGapEtcd      float64 `json:"max_gap_etcd_pause_s"`
	MaxGapBeyond    float64 `json:"max_gap_beyond_tolerance_s"`
}

// Gap is a span without a successful op of Partition, in seconds from
// the workloads' start.
type Gap struct {
	Partition uint32  `json:"partition"`
	From      float64 `json:"from_s"`
	To        float64 `json:"to_s"`
}

func (g Gap) seconds() float64 { return g.To - g.From }

// record counts g in a partition's longest gap of a kind (pmax) and in
// the run's (max, with worst its span).
func (g Gap) record(pmax, max *float64, worst **Gap) {
	*pmax = maxf(*pmax, g.seconds())
	if g.seconds() > *max {
		*max, *worst = g.seconds(), &g
	}
}

// Window is a fault's span, from the workloads' start, and the
// partitions it hit (see Availability).
type Window struct {
	Action     Action
	Start, End time.Duration
	Hit        []uint32
	// Nodes are the nodes it faults: killed, stopped, or cut off (Step.CutOff).
	Nodes []int
	// Other, for a bridge, is its other side (Step.BridgeOther), counted
	// as faulted too while another fault that faults nodes overlaps it:
	// alone, the nodes fence the side CutOff names; with a node killed,
	// stopped or restarted meanwhile, the reports, and so the side
	// fenced, depend on that fault's timing (rejoin chaos --net-faults on
	// --seed 20261210: a bridge with a stop and two kills on top fenced
	// n2 and n3 of the other side, and a partition held on n1, n2 and n3
	// went 15 s without a live replica registered).
	Other []int
}

// measured reports whether a gap over w counts: the faults that should
// leave the write path running (a kill's partitions fail over by
// design, and its restart is a rejoin, which bench measures).
func (w Window) measured() bool {
	return w.Action.IsNet() || w.Action == ActStop || w.Action == ActPauseEtcd
}

// availability computes the gaps of partitions 0..partitions-1 from
// their successful completion times done (from the workloads' start, in
// any order) and the fault windows, over a workload that ran until end:
// the workload's start and end bound the first and last gaps, so a
// partition that never answered again counts to the end.
func availability(done map[uint32][]time.Duration, partitions uint32, nodes int, windows []Window, end time.Duration) Availability {
	a := Availability{Windows: len(windows)}
	var etcd []span
	for _, w := range windows {
		if w.Action == ActPauseEtcd {
			etcd = append(etcd, span{w.Start, w.End + EtcdResumeAllowance})
		}
	}
	beyond := beyondTolerance(windows, (nodes-1)/2)
	apart := slices.Concat(etcd, beyond)
	for p := range partitions {
		ts := slices.Clone(done[p])
		slices.Sort(ts)
		pa := PartitionAvailability{Partition: p, OKOps: len(ts)}
		ts = append(append([]time.Duration{0}, ts...), end)
		for i := 1; i < len(ts); i++ {
			gap := span{ts[i-1], ts[i]}
			g := Gap{Partition: p, From: gap.from.Seconds(), To: gap.to.Seconds()}
			if gap.overlaps(etcd) {
				g.record(&pa.MaxGapEtcd, &a.MaxGapEtcd, &a.WorstEtcd)
			}
			if gap.overlaps(beyond) {
				g.record(&pa.MaxGapBeyond, &a.MaxGapBeyond, &a.WorstBeyond)
			}
			for _, piece := range gap.minus(apart) {
				a.measure(&pa, p, piece, windows)
			}
		}
		a.Partitions = append(a.Partitions, pa)
	}
	slices.SortStableFunc(a.Over, func(x, y GapOver) int { return cmp.Compare(y.Wait, x.Wait) })
	if len(a.Over) > overMax {
		a.Over = a.Over[:overMax]
	}
	return a
}

// beyondTolerance returns the spans in which the windows fault more
// than tolerated nodes at once.
func beyondTolerance(windows []Window, tolerated int) []span {
	var cuts []time.Duration
	for _, w := range windows {
		if len(w.Nodes) > 0 {
			cuts = append(cuts, w.Start, w.End)
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []span
	for i := 1; i < len(cuts); i++ {
		s := span{cuts[i-1], cuts[i]}
		faulted := map[int]bool{}
		var in []Window
		for _, w := range windows {
			if w.Start <= s.from && s.to <= w.End && len(w.Nodes) > 0 {
				in = append(in, w)
			}
		}
		for _, w := range in {
			for _, n := range w.Nodes {
				faulted[n] = true
			}
			if len(in) > 1 {
				for _, n := range w.Other {
					faulted[n] = true
				}
			}
		}
		if len(faulted) <= tolerated {
			continue
		}
		if k := len(out) - 1; k >= 0 && out[k].to == s.from {
			out[k].to = s.to
		} else {
			out = append(out, s)
		}
	}
	return out
}

// measure counts the gap g of partition p (pa's) if a measured window
// overlaps it.
func (a *Availability) measure(pa *PartitionAvailability, p uint32, g span, windows []Window) {
	counted, faulted := false, false
	var faults []string
	var starts []time.Duration // of the faults that hit p, within g
	for _, w := range windows {
		if g.from >= w.End || g.to <= w.Start {
			continue
		}
		counted = counted || w.measured()
		hit := slices.Contains(w.Hit, p)
		faulted = faulted || hit
		if hit && w.Start > g.from {
			starts = append(starts, w.Start)
		}
		f := fmt.Sprintf("%s +%.2fs..+%.2fs", w.Action, w.Start.Seconds(), w.End.Seconds())
		if hit {
			f += " (hit)"
		}
		faults = append(faults, f)
	}
	if !counted {
		return
	}
	gap := Gap{Partition: p, From: g.from.Seconds(), To: g.to.Seconds()}
	bound, wait := GapBoundUnfaulted, gap
	if faulted {
		bound = GapBoundFaulted
		gap.record(&pa.MaxGapFaulted, &a.MaxGapFaulted, &a.WorstFaulted)
		slices.Sort(starts)
		wait = Gap{Partition: p}
		from := g.from
		for _, at := range append(starts, g.to) {
			if piece := (Gap{Partition: p, From: from.Seconds(), To: at.Seconds()}); piece.seconds() > wait.seconds() {
				wait = piece
			}
			from = at
		}
		wait.record(&pa.MaxWaitFaulted, &a.MaxWaitFaulted, &a.WorstWaitFaulted)
	} else {
		gap.record(&pa.MaxGapUnfaulted, &a.MaxGapUnfaulted, &a.WorstUnfaulted)
	}
	if wait.seconds() > bound.Seconds() {
		a.Over = append(a.Over, GapOver{Gap: gap, Faulted: faulted, Wait: wait.seconds(), Faults: faults})
	}
}

// span is [from, to) from the workloads' start.
type span struct{ from, to time.Duration }

// overlaps reports whether s and one of spans share a moment.
func (s span) overlaps(spans []span) bool {
	return slices.ContainsFunc(spans, func(c span) bool { return c.from < s.to && s.from < c.to })
}

// minus is s without the spans cut (in any order, overlapping or not):
// the pieces left, in order; s itself when cut misses it.
func (s span) minus(cut []span) []span {
	out := []span{s}
	for _, c := range cut {
		var next []span
		for _, o := range out {
			if c.to <= o.from || c.from >= o.to {
				next = append(next, o)
				continue
			}
			if o.from < c.from {
				next = append(next, span{o.from, c.from})
			}
			if c.to < o.to {
				next = append(next, span{c.to, o.to})
			}
		}
		out = next
	}
	return out
}

func maxf(a, b float64) float64 {
	if a > b {
		return a
	}
	return b
}

// The bounds of --availability-bounds (issue 23's goal): the longest gap
// of a partition with a faulted replica, and of one without.
const (
	GapBoundFaulted   = 3 * time.Second
	GapBoundUnfaulted = 500 * time.Millisecond
)

// completions records when ops succeeded, by partition, from t0.
type completions struct {
	t0 time.Time
	mu sync.Mutex
	at map[uint32][]time.Duration
}

func newCompletions(t0 time.Time) *completions {
	return &completions{t0: t0, at: map[uint32][]time.Duration{}}
}

func (c *completions) add(p uint32, at time.Time) {
	c.mu.Lock()
	c.at[p] = append(c.at[p], at.Sub(c.t0))
	c.mu.Unlock()
}

func (c *completions) snapshot() map[uint32][]time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[uint32][]time.Duration, len(c.at))
	for p, ts := range c.at {
		out[p] = slices.Clone(ts)
	}
	return out
}
