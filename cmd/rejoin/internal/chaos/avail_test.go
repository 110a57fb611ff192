package chaos

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func secs(xs ...float64) []time.Duration {
	out := make([]time.Duration, len(xs))
	for i, x := range xs {
		out[i] = time.Duration(x * float64(time.Second))
	}
	return out
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

// TestAvailability: gaps count only over network and pause windows; a
// gap is faulted if a window over it (a kill's too) hit the partition;
// the workload's end closes the last gap; a gap over an etcd pause or
// the allowance after it counts apart, and only its pieces outside them
// count as faulted or unfaulted.
func TestAvailability(t *testing.T) {
	done := map[uint32][]time.Duration{
		// Partition 0: a stall of 4.8 s over a net fault that hit it, ops
		// every 0.3 s at most through the etcd pause but one 0.7 s gap.
		0: secs(0.1, 0.2, 5.0, 5.1, 7.9, 8.1, 8.3, 8.6, 8.9, 9.2, 9.9),
		// Partition 1: a 1.4 s gap over the same fault, which did not hit
		// it, and a 2.9 s gap outside every window (not counted).
		1: secs(0.1, 1.5, 2.3, 3.1, 6.0, 8.0, 8.4, 8.8, 9.1),
		// Partition 2: 1 s gaps during the net fault that hit it; nothing
		// after 7 s, over an etcd pause from 8 s (hit none) and a kill
		// hitting it from 8.5 s: the etcd pause's to the end, and its
		// piece before the pause is over no measured window.
		2: secs(0.05, 1, 2, 3, 4, 5, 6, 7),
		// Partition 3: no op at all, no window hit it: the whole run is
		// the etcd pause's, and its 8 s before it over the net fault
		// count unfaulted.
	}
	windows := []Window{
		{Action: ActNetPeers, Start: 1 * time.Second, End: 3 * time.Second, Hit: []uint32{0, 2}},
		{Action: ActPauseEtcd, Start: 8 * time.Second, End: 9 * time.Second},
		{Action: ActKill, Start: 8500 * time.Millisecond, End: 11 * time.Second, Hit: []uint32{2}},
	}
	a := availability(done, 4, 5, windows, 10*time.Second)
	want := []PartitionAvailability{
		{Partition: 0, OKOps: 11, MaxGapFaulted: 4.8, MaxGapUnfaulted: 0, MaxGapEtcd: 0.7},
		{Partition: 1, OKOps: 9, MaxGapUnfaulted: 1.4, MaxGapEtcd: 0.9},
		{Partition: 2, OKOps: 8, MaxGapFaulted: 1, MaxGapEtcd: 3},
		{Partition: 3, OKOps: 0, MaxGapUnfaulted: 8, MaxGapEtcd: 10},
	}
	if len(a.Partitions) != len(want) {
		t.Fatalf("partitions %+v", a.Partitions)
	}
	for i, w := range want {
		g := a.Partitions[i]
		if g.Partition != w.Partition || g.OKOps != w.OKOps || !near(g.MaxGapFaulted, w.MaxGapFaulted) || !near(g.MaxGapUnfaulted, w.MaxGapUnfaulted) || !near(g.MaxGapEtcd, w.MaxGapEtcd) {
			t.Errorf("partition %d: %+v, want %+v", i, g, w)
		}
	}
	if !near(a.MaxGapFaulted, 4.8) || a.WorstFaulted == nil || a.WorstFaulted.Partition != 0 || !near(a.WorstFaulted.From, 0.2) || !near(a.WorstFaulted.To, 5) {
		t.Errorf("faulted: %v %+v", a.MaxGapFaulted, a.WorstFaulted)
	}
	if !near(a.MaxGapUnfaulted, 8) || a.WorstUnfaulted == nil || a.WorstUnfaulted.Partition != 3 || !near(a.WorstUnfaulted.To, 8) {
		t.Errorf("unfaulted: %v %+v", a.MaxGapUnfaulted, a.WorstUnfaulted)
	}
	if !near(a.MaxGapEtcd, 10) || a.WorstEtcd == nil || a.WorstEtcd.Partition != 3 {
		t.Errorf("etcd pause: %v %+v", a.MaxGapEtcd, a.WorstEtcd)
	}
	// Past the bounds, longest first: partition 3's 8 s, partition 0's
	// 4.8 s (hit, under the net fault), partition 1's 1.4 s and two
	// 0.8 s; partition 2's 1 s gaps (hit: bound 3 s) are within.
	var over []string
	for _, g := range a.Over {
		over = append(over, fmt.Sprintf("%d %.1f %v %v", g.Partition, g.seconds(), g.Faulted, g.Faults))
	}
	wantOver := []string{
		"3 8.0 false [net-peers +1.00s..+3.00s]",
		"0 4.8 true [net-peers +1.00s..+3.00s (hit)]",
		"1 1.4 false [net-peers +1.00s..+3.00s]",
		"1 0.8 false [net-peers +1.00s..+3.00s]",
		"1 0.8 false [net-peers +1.00s..+3.00s]",
	}
	if !slices.Equal(over, wantOver) {
		t.Errorf("over the bounds:\n%s\nwant\n%s", strings.Join(over, "\n"), strings.Join(wantOver, "\n"))
	}
	if a.Windows != 3 {
		t.Errorf("windows %d", a.Windows)
	}

	// Without a network or pause window nothing counts, kills or not.
	a = availability(done, 4, 5, windows[2:], 10*time.Second)
	if a.MaxGapFaulted != 0 || a.MaxGapUnfaulted != 0 || a.WorstFaulted != nil {
		t.Errorf("a kill alone counted: %+v", a)
	}
	// A stop counts as a pause.
	a = availability(map[uint32][]time.Duration{0: secs(1, 4)}, 1, 5, []Window{{Action: ActStop, Start: 2 * time.Second, End: 3 * time.Second, Hit: []uint32{0}}}, 5*time.Second)
	if !near(a.MaxGapFaulted, 3) {
		t.Errorf("stop: %+v", a)
	}
}

// TestAvailabilityWaitFromEachFault: a faulted gap is bounded from each
// start of a fault that hit the partition, not whole. Partition 0: a
// node of its replicas cut off at 18.27 s, another stopped at 19.79 s,
// no op from 18.24 to 21.95 s (chaos seed 354310367): 3.71 s whole, at
// most 2.16 s from a fault's start, within the bound. Partition 1: the
// same two faults, and no op from 18.24 s to 26 s: 6.21 s from the
// second's start, over it. Partition 2: hit by the first only, from
// 0.03 s into the gap, a second fault that hit none of its replicas
// (at 20 s) does not restart its wait: 3.68 s, over it.
func TestAvailabilityWaitFromEachFault(t *testing.T) {
	windows := []Window{
		{Action: ActNetHalves, Start: 18270 * time.Millisecond, End: 40 * time.Second, Hit: []uint32{0, 1, 2}, Nodes: []int{5}},
		{Action: ActStop, Start: 19790 * time.Millisecond, End: 25 * time.Second, Hit: []uint32{0, 1}, Nodes: []int{2}},
		{Action: ActNetPeers, Start: 20 * time.Second, End: 21 * time.Second, Hit: []uint32{3}, Nodes: []int{3}},
	}
	// Ops every 0.2 s from 17 s to 41 s but in each partition's gap.
	gaps := [][2]float64{{18.24, 21.95}, {18.24, 26}, {18.24, 21.95}, {0, 0}}
	done := map[uint32][]time.Duration{}
	for p, g := range gaps {
		for at := 17.0; at <= 41; at += 0.2 {
			if at <= g[0] || at >= g[1] {
				done[uint32(p)] = append(done[uint32(p)], secs(at)...)
			}
		}
		if g[0] > 0 {
			done[uint32(p)] = append(done[uint32(p)], secs(g[0], g[1])...)
		}
	}
	a := availability(done, 4, 7, windows, 41*time.Second)
	if !near(a.MaxGapFaulted, 7.76) || !near(a.Partitions[0].MaxGapFaulted, 3.71) {
		t.Errorf("whole gaps: %v, partition 0 %v", a.MaxGapFaulted, a.Partitions[0].MaxGapFaulted)
	}
	if w := a.Partitions[0].MaxWaitFaulted; !near(w, 2.16) {
		t.Errorf("partition 0 waited %v from a fault's start, want 2.16", w)
	}
	if w := a.Partitions[2].MaxWaitFaulted; !near(w, 3.68) {
		t.Errorf("partition 2 waited %v from a fault's start, want 3.68 (the fault at 20 s hit none of its replicas)", w)
	}
	if !near(a.MaxWaitFaulted, 6.21) || a.WorstWaitFaulted == nil || a.WorstWaitFaulted.Partition != 1 || !near(a.WorstWaitFaulted.From, 19.79) {
		t.Errorf("longest wait %v %+v, want partition 1's 6.21 s from 19.79 s", a.MaxWaitFaulted, a.WorstWaitFaulted)
	}
	var over []string
	for _, g := range a.Over {
		if g.Faulted {
			over = append(over, fmt.Sprintf("%d %.2f %.2f", g.Partition, g.seconds(), g.Wait))
		}
	}
	if want := []string{"1 7.76 6.21", "2 3.71 3.68"}; !slices.Equal(over, want) {
		t.Errorf("faulted gaps over the bound %v, want %v", over, want)
	}
}

// TestAvailabilityBeyondTolerance: a span in which faults overlap on more
// nodes than a majority of the others can fence (3 of 5 here) counts
// apart; the pieces of a gap before and after it count as any gap.
func TestAvailabilityBeyondTolerance(t *testing.T) {
	windows := []Window{
		{Action: ActKill, Start: 1 * time.Second, End: 5 * time.Second, Hit: []uint32{0}, Nodes: []int{1}},
		{Action: ActStop, Start: 2 * time.Second, End: 6 * time.Second, Hit: []uint32{0}, Nodes: []int{2}},
		{Action: ActNetPeers, Start: 3 * time.Second, End: 4 * time.Second, Nodes: []int{3}},
		// The same node twice is one node.
		{Action: ActNetEtcd, Start: 5500 * time.Millisecond, End: 7 * time.Second, Nodes: []int{2}},
	}
	if got := beyondTolerance(windows, 2); !slices.Equal(got, []span{{3 * time.Second, 4 * time.Second}}) {
		t.Fatalf("beyond: %v", got)
	}
	// Partition 0 (hit by the kill and the stop): a gap from 2.5 to 4.6 s
	// is 2.1 s beyond, pieces of 0.5 and 0.6 s faulted. Partition 1: a
	// gap from 2.8 to 3.5 s, inside the span but for 0.2 s unfaulted.
	done := map[uint32][]time.Duration{
		0: secs(0.1, 0.5, 1, 1.5, 2, 2.5, 4.6, 5, 5.5, 6, 6.5, 7),
		1: secs(0.1, 0.4, 0.8, 1.2, 1.6, 2, 2.4, 2.8, 3.5, 3.9, 4.3, 4.7, 5.1, 5.5, 5.9, 6.3, 6.7, 7),
	}
	a := availability(done, 2, 5, windows, 7*time.Second)
	if !near(a.MaxGapBeyond, 2.1) || a.WorstBeyond == nil || a.WorstBeyond.Partition != 0 {
		t.Errorf("beyond: %v %+v", a.MaxGapBeyond, a.WorstBeyond)
	}
	if !near(a.Partitions[0].MaxGapFaulted, 0.6) || !near(a.Partitions[1].MaxGapUnfaulted, 0.4) || !near(a.Partitions[1].MaxGapBeyond, 0.7) {
		t.Errorf("partitions: %+v", a.Partitions)
	}
}

// TestBridgeBeyondTolerance: a bridge alone faults the side the nodes
// fence, two of five, within what the cluster tolerates; with another
// fault on top it faults both sides, as which one is fenced then depends
// on that fault's timing.
func TestBridgeBeyondTolerance(t *testing.T) {
	bridge := Step{Action: ActNetBridge, Node: 5, Side: []int{1, 4}}
	w := Window{Action: ActNetBridge, Start: 1 * time.Second, End: 10 * time.Second, Nodes: bridge.CutOff(5), Other: bridge.BridgeOther(5)}
	if !slices.Equal(w.Nodes, []int{1, 4}) || !slices.Equal(w.Other, []int{2, 3}) {
		t.Fatalf("bridge {n1,n4} | {n2,n3}: cut off %v, other %v", w.Nodes, w.Other)
	}
	if got := beyondTolerance([]Window{w}, 2); len(got) != 0 {
		t.Errorf("a bridge alone: beyond %v, want none", got)
	}
	stop := Window{Action: ActStop, Start: 3 * time.Second, End: 5 * time.Second, Nodes: []int{1}}
	if got := beyondTolerance([]Window{w, stop}, 2); !slices.Equal(got, []span{{3 * time.Second, 5 * time.Second}}) {
		t.Errorf("a bridge and a stop of a node on its fenced side: beyond %v, want 3s..5s", got)
	}
}

// TestCompletions: completions are kept by partition, from t0.
func TestCompletions(t *testing.T) {
	t0 := time.Now()
	c := newCompletions(t0)
	c.add(1, t0.Add(time.Second))
	c.add(1, t0.Add(2*time.Second))
	c.add(0, t0.Add(3*time.Second))
	s := c.snapshot()
	if len(s[1]) != 2 || s[1][1] != 2*time.Second || len(s[0]) != 1 {
		t.Errorf("snapshot %v", s)
	}
}

// TestProbeFailsIn: a partition's probe failures within a gap, each node
// and error once with its count, in the order first seen, bounded.
func TestProbeFailsIn(t *testing.T) {
	pr := &probes{fails: map[uint32][]probeFail{}}
	pr.fails[0] = []probeFail{
		{at: 900 * time.Millisecond, node: 1, err: "before the gap"},
		{at: 1100 * time.Millisecond, node: 4, err: "deadline"},
		{at: 1400 * time.Millisecond, node: 5, err: "deadline"},
		{at: 1700 * time.Millisecond, node: 4, err: "deadline"},
		{at: 1800 * time.Millisecond, node: 4, err: strings.Repeat("x", probeErrBytesMax+10)},
		{at: 1900 * time.Millisecond, node: 2, err: "refused"},
		{at: 2100 * time.Millisecond, node: 3, err: "after the gap"},
	}
	pr.fails[1] = []probeFail{{at: 1500 * time.Millisecond, node: 1, err: "another partition"}}
	got := pr.failsIn(0, 1, 2, 3)
	want := []string{"n4 x2: deadline", "n5 x1: deadline", "n4 x1: " + strings.Repeat("x", probeErrBytesMax) + "...", "... 1 more"}
	if !slices.Equal(got, want) {
		t.Errorf("failsIn:\n%q\nwant\n%q", got, want)
	}
	if got := pr.failsIn(2, 0, 10, 3); got != nil {
		t.Errorf("a partition without failures: %q", got)
	}
}

// TestProbeNext: after a failure a probe tries its partition's holders in
// the client's order, then the other nodes after the one that failed,
// each at most once until a success; once all have failed it starts
// again from the holders.
func TestProbeNext(t *testing.T) {
	holders := []string{"n3", "n1", "n5"}
	failed := make([]bool, 5)
	at := 0 // n1, the partition's home lane, fails
	var got []int
	for range 6 {
		failed[at] = true
		at = probeNext(holders, failed, at)
		got = append(got, at)
	}
	// n3, n5 (n1 failed), then n2 and n4; then every node has failed and
	// the round starts over from the holders: n3, n1.
	if want := []int{2, 4, 1, 3, 2, 0}; !slices.Equal(got, want) {
		t.Fatalf("lanes tried %v, want %v", got, want)
	}
	// A success clears the round (probes.run): the next failure goes to
	// the first holder again.
	clear(failed)
	failed[1] = true
	if got := probeNext(holders, failed, 1); got != 2 {
		t.Fatalf("after n2 failed: lane %d, want 2 (n3)", got)
	}
}
