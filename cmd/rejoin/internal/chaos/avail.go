package chaos

import (
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
type Availability struct {
	// MaxGapFaulted and MaxGapUnfaulted are the longest gaps of each kind
	// over the partitions, in seconds (0: none of that kind).
	MaxGapFaulted   float64 `json:"max_gap_faulted_s"`
	MaxGapUnfaulted float64 `json:"max_gap_unfaulted_s"`
	// Worst names the partition and the span of each longest gap.
	WorstFaulted   *Gap `json:"worst_faulted,omitempty"`
	WorstUnfaulted *Gap `json:"worst_unfaulted,omitempty"`
	// Partitions has every partition's figures.
	Partitions []PartitionAvailability `json:"partitions,omitempty"`
	// Windows is how many fault windows were measured against.
	Windows int `json:"windows"`
}

// PartitionAvailability is one partition's successful ops and its
// longest gaps, in seconds.
type PartitionAvailability struct {
	Partition       uint32  `json:"partition"`
	OKOps           int     `json:"ok_ops"`
	MaxGapFaulted   float64 `json:"max_gap_faulted_s"`
	MaxGapUnfaulted float64 `json:"max_gap_unfaulted_s"`
}

// Gap is a span without a successful op of Partition, in seconds from
// the workloads' start.
type Gap struct {
	Partition uint32  `json:"partition"`
	From      float64 `json:"from_s"`
	To        float64 `json:"to_s"`
}

func (g Gap) seconds() float64 { return g.To - g.From }

// Window is a fault's span, from the workloads' start, and the
// partitions it hit (see Availability).
type Window struct {
	Action     Action
	Start, End time.Duration
	Hit        []uint32
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
func availability(done map[uint32][]time.Duration, partitions uint32, windows []Window, end time.Duration) Availability {
	a := Availability{Windows: len(windows)}
	for p := range partitions {
		ts := slices.Clone(done[p])
		slices.Sort(ts)
		pa := PartitionAvailability{Partition: p, OKOps: len(ts)}
		ts = append(append([]time.Duration{0}, ts...), end)
		for i := 1; i < len(ts); i++ {
			from, to := ts[i-1], ts[i]
			counted, faulted := false, false
			for _, w := range windows {
				if from >= w.End || to <= w.Start {
					continue
				}
				counted = counted || w.measured()
				faulted = faulted || slices.Contains(w.Hit, p)
			}
			if !counted {
				continue
			}
			g := Gap{Partition: p, From: from.Seconds(), To: to.Seconds()}
			max, worst, pmax := &a.MaxGapUnfaulted, &a.WorstUnfaulted, &pa.MaxGapUnfaulted
			if faulted {
				max, worst, pmax = &a.MaxGapFaulted, &a.WorstFaulted, &pa.MaxGapFaulted
			}
			*pmax = maxf(*pmax, g.seconds())
			if g.seconds() > *max {
				*max, *worst = g.seconds(), &g
			}
		}
		a.Partitions = append(a.Partitions, pa)
	}
	return a
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
