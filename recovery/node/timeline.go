package node

import (
	"context"
	"sync"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
)

// The timeline recorder: every TimelineEvery the node reads what each
// replica publishes (its atomic status, refreshed every tick) and appends
// one sample to the timeline of each rejoin attempt under way on it, as
// destination or source. GET /timeline serves them; `rejoin demo --plot`
// draws them. It reads only what the replicas already publish, so it
// takes nothing from their goroutines.
//
// Bounds: each timeline keeps its latest TimelineSamplesMax samples (a
// ring: the oldest go first, counted in Dropped), and the recorder keeps
// at most TimelineRejoinsMax timelines: a new attempt takes the place of
// the oldest ended one. When every kept timeline is under way, a new
// attempt goes unrecorded (counted in Untracked) until one ends: evicting
// a running one would only bring it back at the next pass. An attempt
// that leaves the status without being seen to end (superseded, its
// replica gone) ends its timeline at the first pass that misses it.
const (
	TimelineEvery      = 100 * time.Millisecond
	TimelineSamplesMax = 1200 // 2 minutes at TimelineEvery
	TimelineRejoinsMax = 256
)

// TimelineSample is one side of one rejoin attempt at one instant. The
// counters are cumulative since the attempt's start, as the replica
// reports them (RejoinStatus), so a sample lost or late costs no
// accuracy: a rate is the difference of two samples over their At.
type TimelineSample struct {
	At    time.Time `json:"at"`
	Phase string    `json:"phase"`
	// Rows and Bytes are tuple rows and bytes sent (source) or applied
	// (destination), snapshot and catch-up; SnapshotRows the snapshot's.
	Rows         int64 `json:"rows"`
	Bytes        int64 `json:"bytes"`
	SnapshotRows int64 `json:"snapshot_rows"`
	// LogBytesPeak is the source's change log's peak so far (what the
	// replica publishes: it carries no current size).
	LogBytesPeak int `json:"log_bytes_peak"`
	// ThrottledMs and PeerHoldMs are the cumulative throttle and hold;
	// Throttled says either grew since the previous sample.
	ThrottledMs float64 `json:"throttled_ms"`
	PeerHoldMs  float64 `json:"peer_hold_ms,omitempty"`
	Throttled   bool    `json:"throttled"`
	// TxnsExecuted is the replica's txns executed (its partition's txn
	// rate, as a difference of two samples).
	TxnsExecuted uint64 `json:"txns_executed"`
}

// Timeline is one side of one rejoin attempt, sampled every EveryMs.
type Timeline struct {
	Partition uint32    `json:"partition"`
	Role      string    `json:"role"` // "source" or "destination"
	Peer      string    `json:"peer"`
	Epoch     uint64    `json:"epoch"`
	Started   time.Time `json:"started"`
	// Ended is when the attempt ended (went live, done, aborted), Err why
	// it failed; both empty while it runs.
	Ended time.Time `json:"ended,omitzero"`
	Err   string    `json:"err,omitempty"`
	// Dropped counts the oldest samples the ring let go.
	Dropped int              `json:"dropped,omitempty"`
	Samples []TimelineSample `json:"samples"`
}

// Timelines is what GET /timeline serves: the node's kept timelines,
// in the order the recorder first saw them.
type Timelines struct {
	Node    string  `json:"node"`
	EveryMs float64 `json:"every_ms"`
	// Untracked counts the attempts under way at the latest pass that
	// have no timeline (TimelineRejoinsMax timelines under way already).
	Untracked int        `json:"untracked,omitempty"`
	Rejoins   []Timeline `json:"rejoins"`
}

type timelineKey struct {
	partition uint32
	role      string
	peer      string
	epoch     uint64
}

// timelineRing is one attempt's side. Invariant: samples holds at most
// samplesMax samples; once full, head is the oldest and each new sample
// takes its place.
type timelineRing struct {
	t       Timeline // the header; t.Samples unused
	samples []TimelineSample
	head    int
	ended   bool
	// seen is the latest pass that found the attempt in the status.
	seen time.Time
}

func (r *timelineRing) add(s TimelineSample, samplesMax int) {
	if len(r.samples) < samplesMax {
		r.samples = append(r.samples, s)
		return
	}
	r.samples[r.head] = s
	r.head = (r.head + 1) % samplesMax
	r.t.Dropped++
}

func (r *timelineRing) last() (TimelineSample, bool) {
	if len(r.samples) == 0 {
		return TimelineSample{}, false
	}
	i := len(r.samples) - 1
	if r.head > 0 {
		i = r.head - 1
	}
	return r.samples[i], true
}

// timeline copies the ring out, oldest sample first.
func (r *timelineRing) timeline() Timeline {
	t := r.t
	t.Samples = make([]TimelineSample, 0, len(r.samples))
	t.Samples = append(t.Samples, r.samples[r.head:]...)
	t.Samples = append(t.Samples, r.samples[:r.head]...)
	return t
}

// timelines is the node's recorder. sample runs on the recorder's
// goroutine; snapshot on the HTTP server's: mu guards both.
type timelines struct {
	samplesMax, rejoinsMax int

	mu sync.Mutex
	// prev is the previous pass's time: an attempt first seen ended is
	// recorded only if it ended since (it started and ended between two
	// passes); one that ended before was recorded, and may be evicted.
	prev time.Time
	by   map[timelineKey]*timelineRing
	// untracked: attempts under way the latest pass found no room for.
	untracked int
	// order is every kept key, oldest first.
	order []timelineKey
}

func newTimelines(samplesMax, rejoinsMax int) *timelines {
	if samplesMax < 1 || rejoinsMax < 1 {
		panic("node: timeline bounds must be positive")
	}
	return &timelines{samplesMax: samplesMax, rejoinsMax: rejoinsMax, by: map[timelineKey]*timelineRing{}}
}

// run samples every every until ctx ends. replicas yields each hosted
// replica's published status.
func (tl *timelines) run(ctx context.Context, every time.Duration, replicas func(yield func(*ReplicaStatus))) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			tl.sample(now, replicas)
		}
	}
}

// sample appends a sample to the timeline of each attempt a replica
// reports that has not ended before, and ends the timelines of those
// that ended since.
func (tl *timelines) sample(now time.Time, replicas func(yield func(*ReplicaStatus))) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.untracked = 0
	replicas(func(rs *ReplicaStatus) {
		if rs.Rejoin != nil {
			tl.addLocked(now, rs, rs.Rejoin)
		}
		for i := range rs.Sources {
			tl.addLocked(now, rs, &rs.Sources[i])
		}
	})
	for _, k := range tl.order {
		if r := tl.by[k]; !r.ended && !r.seen.Equal(now) {
			r.ended = true
			r.t.Ended, r.t.Err = tl.prev, "left the replica's status unseen (superseded, or the replica went)"
		}
	}
	tl.prev = now
}

func (tl *timelines) addLocked(now time.Time, rs *ReplicaStatus, st *RejoinStatus) {
	k := timelineKey{partition: rs.Partition, role: st.Role, peer: st.Peer, epoch: st.Epoch}
	r := tl.by[k]
	if r == nil {
		if ended := endedAt(st); !ended.IsZero() && !ended.After(tl.prev) {
			return // ended before the previous pass: evicted, or never seen
		}
		if !tl.evictLocked() {
			tl.untracked++
			return
		}
		r = &timelineRing{t: Timeline{Partition: rs.Partition, Role: st.Role, Peer: st.Peer, Epoch: st.Epoch, Started: st.Started}}
		tl.by[k] = r
		tl.order = append(tl.order, k)
	}
	r.seen = now
	if r.ended {
		return
	}
	s := TimelineSample{At: now, Phase: st.Phase, Rows: st.Rows, Bytes: st.Bytes, SnapshotRows: st.SnapshotRows,
		LogBytesPeak: st.LogBytesPeak, ThrottledMs: st.ThrottledMs, PeerHoldMs: st.PeerHoldMs, TxnsExecuted: rs.TxnsExecuted}
	if prev, ok := r.last(); ok {
		s.Throttled = s.ThrottledMs > prev.ThrottledMs || s.PeerHoldMs > prev.PeerHoldMs
	} else {
		s.Throttled = s.ThrottledMs > 0 || s.PeerHoldMs > 0
	}
	r.add(s, tl.samplesMax)
	// A live destination goes on reporting its attempt without an end
	// time (it keeps routing the feed through it): its final phase ends
	// the timeline.
	if !st.Ended.IsZero() || finalPhase(st.Phase) {
		r.ended = true
		r.t.Ended, r.t.Err = st.Ended, st.Err
		if r.t.Ended.IsZero() {
			r.t.Ended = now
		}
	}
}

// evictLocked makes room for one more timeline, if need be by evicting
// the oldest ended one; false: every kept one is under way.
func (tl *timelines) evictLocked() bool {
	if len(tl.order) < tl.rejoinsMax {
		return true
	}
	for i, k := range tl.order {
		if tl.by[k].ended {
			delete(tl.by, k)
			tl.order = append(tl.order[:i], tl.order[i+1:]...)
			return true
		}
	}
	return false
}

// snapshot copies the kept timelines out, those of partition p only if
// p >= 0, the latest last of them if last > 0; oldest first.
func (tl *timelines) snapshot(p int64, last int) []Timeline {
	out, _ := tl.snapshotUntracked(p, last)
	return out
}

func (tl *timelines) snapshotUntracked(p int64, last int) ([]Timeline, int) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	out := []Timeline{}
	for _, k := range tl.order {
		if p >= 0 && int64(k.partition) != p {
			continue
		}
		out = append(out, tl.by[k].timeline())
	}
	if last > 0 && len(out) > last {
		out = out[len(out)-last:]
	}
	return out, tl.untracked
}

// endedAt is when an attempt ended, zero while it runs. A live
// destination reports no end time: its start stands for it (it went live
// after that).
func endedAt(st *RejoinStatus) time.Time {
	switch {
	case !st.Ended.IsZero():
		return st.Ended
	case finalPhase(st.Phase):
		return st.Started
	}
	return time.Time{}
}

func finalPhase(phase string) bool {
	return phase == recovery.StateLive.String() || phase == recovery.StateDone.String() || phase == recovery.StateAborted.String()
}

// replicaStatuses yields each hosted replica's published status.
func (n *Node) replicaStatuses(yield func(*ReplicaStatus)) {
	for _, r := range n.hosted() {
		if st := r.status.Load(); st != nil {
			yield(st)
		}
	}
}
