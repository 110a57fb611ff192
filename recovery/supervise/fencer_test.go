package supervise

import (
	"testing"
	"time"
)

// TestFencerNext: a majority's fence is tried by its reporters that
// suspect the very process, at most every tryEvery; the cut's pick only
// once a report on it has stood cutAfter here, never while a majority's
// is due, and not with the cut's fence off.
func TestFencerNext(t *testing.T) {
	at := func(ms int64) time.Time { return time.Unix(0, ms*int64(time.Millisecond)) }
	rec := func(id string, started int64) NodeRecord { return NodeRecord{ID: id, Started: time.Unix(started, 0)} }
	nodes := map[string]NodeRecord{"n1": rec("n1", 1), "n2": rec("n2", 2), "n3": rec("n3", 3)}
	inc := func(id string) int64 { return ProcessOf(nodes[id]) }
	cutView := FenceView{Nodes: nodes, Cut: []Due{{Node: "n2", Reporters: []string{"n1"}}}}
	majority := FenceView{Nodes: nodes, Due: []Due{{Node: "n3", Reporters: []string{"n1", "n2"}}}}

	f := NewFencer("n1", 500*time.Millisecond, 500*time.Millisecond, false)
	if got := f.Next(at(0), cutView, map[string]int64{"n2": inc("n2")}); len(got) != 0 {
		t.Fatalf("the cut's pick on its first view: %v, want nothing yet", got)
	}
	if got := f.Next(at(400), cutView, map[string]int64{"n2": inc("n2")}); len(got) != 0 {
		t.Fatalf("the cut's pick reported 400 ms: %v, want nothing yet", got)
	}
	if got := f.Next(at(500), cutView, map[string]int64{"n2": 99}); len(got) != 0 {
		t.Fatalf("another process of n2 suspected: %v, want nothing", got)
	}
	got := f.Next(at(500), cutView, map[string]int64{"n2": inc("n2")})
	if len(got) != 1 || got[0].Node != "n2" || !got[0].Cut {
		t.Fatalf("the cut's pick reported 500 ms: %v, want n2's fence", got)
	}
	f.Tried(at(500), "n2")
	if got := f.Next(at(700), cutView, map[string]int64{"n2": inc("n2")}); len(got) != 0 {
		t.Fatalf("200 ms after a try: %v, want nothing", got)
	}
	if got := f.Next(at(1000), cutView, map[string]int64{"n2": inc("n2")}); len(got) != 1 {
		t.Fatalf("500 ms after a try: %v, want n2's fence again", got)
	}
	// n2 no longer among the picks: its standing starts again.
	f.Next(at(1100), FenceView{Nodes: nodes}, nil)
	if got := f.Next(at(1200), cutView, map[string]int64{"n2": inc("n2")}); len(got) != 0 {
		t.Fatalf("picked again 0 ms: %v, want nothing yet", got)
	}

	got = f.Next(at(2000), majority, map[string]int64{"n3": inc("n3")})
	if len(got) != 1 || got[0].Node != "n3" || got[0].Cut {
		t.Fatalf("a majority's fence: %v, want n3's at once", got)
	}
	both := majority
	both.Cut = cutView.Cut
	if got := f.Next(at(9000), both, map[string]int64{"n3": inc("n3"), "n2": inc("n2")}); len(got) != 1 || got[0].Node != "n3" {
		t.Fatalf("a majority's due with a cut's pick: %v, want n3's alone", got)
	}
	if got := NewFencer("n3", 0, 0, false).Next(at(0), majority, map[string]int64{"n3": inc("n3")}); len(got) != 0 {
		t.Fatalf("the suspect itself: %v, want nothing", got)
	}
	// A bridge's second pick, planned as long as the first, goes as
	// soon as the first is fenced.
	bridge := NewFencer("n2", 500*time.Millisecond, 0, false)
	plan := []Due{{Node: "n3", Reporters: []string{"n2"}}, {Node: "n1", Reporters: []string{"n2"}}}
	suspected := map[string]int64{"n1": inc("n1"), "n3": inc("n3")}
	if got := bridge.Next(at(0), FenceView{Nodes: nodes, Cut: plan}, suspected); len(got) != 0 {
		t.Fatalf("a bridge's plan at once: %v, want nothing yet", got)
	}
	if got := bridge.Next(at(500), FenceView{Nodes: nodes, Cut: plan}, suspected); len(got) != 1 || got[0].Node != "n3" {
		t.Fatalf("a bridge's plan 500 ms on: %v, want n3's fence", got)
	}
	if got := bridge.Next(at(600), FenceView{Nodes: nodes, Cut: plan[1:]}, suspected); len(got) != 1 || got[0].Node != "n1" {
		t.Fatalf("the bridge's second pick once the first is fenced: %v, want n1's at once", got)
	}
	off := NewFencer("n1", 0, 0, true)
	if got := off.Next(at(0), cutView, map[string]int64{"n2": inc("n2")}); len(got) != 0 {
		t.Fatalf("the cut's fence off: %v, want nothing", got)
	}
}
