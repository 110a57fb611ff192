package chaos

import (
	"slices"
	"testing"
	"time"
)

func TestPlanIsAFunctionOfTheSeed(t *testing.T) {
	const d, ttl = 3 * time.Minute, 4 * time.Second
	a := Plan(42, d, 5, ttl, Actions)
	if b := Plan(42, d, 5, ttl, Actions); !slices.EqualFunc(a, b, Step.Equal) {
		t.Fatalf("the same seed planned two schedules:\n%v\n%v", a, b)
	}
	if c := Plan(43, d, 5, ttl, Actions); slices.EqualFunc(a, c, Step.Equal) {
		t.Fatalf("seeds 42 and 43 planned the same schedule %v", a)
	}
	seen := map[Action]bool{}
	var last time.Duration
	for _, s := range a {
		seen[s.Action] = true
		switch {
		case s.At <= last || s.At >= d || s.At-last < gapMin || s.At-last > gapMax:
			t.Fatalf("step %v: at %s after %s, want gaps of %s..%s within %s", s, s.At, last, gapMin, gapMax, d)
		case (s.Action == ActKill || s.Action == ActStop) && (s.Node < 1 || s.Node > 5):
			t.Fatalf("step %v: node out of 1..5", s)
		case s.Action == ActStop && (s.For <= ttl || s.For > ttl+stopPastTTL):
			t.Fatalf("step %v: a stop must outlast the TTL %s by at most %s", s, ttl, stopPastTTL)
		case (s.Action == ActKill || s.Action == ActKillSource || s.Action == ActKillDestination) && (s.For < 0 || s.For > KillDownMax):
			t.Fatalf("step %v: downtime out of 0..%s", s, KillDownMax)
		case s.Action == ActPauseEtcd && (s.For < etcdPauseMin || s.For > etcdPauseMax):
			t.Fatalf("step %v: etcd pause out of %s..%s", s, etcdPauseMin, etcdPauseMax)
		}
		last = s.At
	}
	// Ten actions, some of a weight of 10 in 160: three runs draw each.
	for seed := int64(43); seed <= 44; seed++ {
		for _, s := range Plan(seed, d, 5, ttl, Actions) {
			seen[s.Action] = true
		}
	}
	if len(seen) != len(Actions) {
		t.Fatalf("3 minutes of seeds 42 to 44 drew only %v", seen)
	}
}

// TestPlanNet: the network faults are well formed for every size of
// cluster, last netMin..netMaxFor(d), and come as both kinds; without
// them, a schedule is what it was before they existed (the process
// faults draw nothing more).
func TestPlanNet(t *testing.T) {
	net := []Action{ActNetPeers, ActNetEtcd, ActNetIsolate, ActNetHalves, ActNetBridge}
	for _, nodes := range []int{2, 3, 4, 5, 7} {
		for _, d := range []time.Duration{25 * time.Second, 90 * time.Second, 3 * time.Minute} {
			kinds, actions := map[NetKind]int{}, map[Action]int{}
			for seed := int64(1); seed <= 20; seed++ {
				steps := Plan(seed, d, nodes, 4*time.Second, net)
				if again := Plan(seed, d, nodes, 4*time.Second, net); !slices.EqualFunc(steps, again, Step.Equal) {
					t.Fatalf("seed %d planned two schedules", seed)
				}
				for _, s := range steps {
					kinds[s.Net]++
					actions[s.Action]++
					checkNetStep(t, s, nodes, d)
				}
			}
			if kinds[NetDrop] == 0 || kinds[NetReset] == 0 || len(kinds) != 2 {
				t.Errorf("%d nodes, %s: kinds %v", nodes, d, kinds)
			}
			if want := len(net) - map[bool]int{true: 1}[nodes < 3]; len(actions) != want {
				t.Errorf("%d nodes, %s: drew %v, want %d actions", nodes, d, actions, want)
			}
		}
	}
	if got, want := netMaxFor(3*time.Minute), 30*time.Second; got != want {
		t.Errorf("netMaxFor(3m) = %s, want %s", got, want)
	}
	if got, want := netMaxFor(90*time.Second), 15*time.Second; got != want {
		t.Errorf("netMaxFor(90s) = %s, want %s", got, want)
	}
	if got := netMaxFor(5 * time.Second); got != netMin {
		t.Errorf("netMaxFor(5s) = %s, want %s", got, netMin)
	}
	proc := WithoutNet(Actions)
	if len(proc) != 5 {
		t.Fatalf("WithoutNet(Actions) = %v", proc)
	}
	// Seed 42's process schedule of three minutes, as planned before the
	// network faults: a replay of an old seed with --net-faults off.
	old := Plan(42, 3*time.Minute, 5, 4*time.Second, proc)
	if len(old) == 0 || old[0].String() != "+  2.80s kill-source (pick 11), restart after 1.64s" || old[1].String() != "+  6.06s pause etcd for 2.00s" {
		t.Errorf("seed 42's first process fault: %v", old[0])
	}
}

// checkNetStep checks one network step of a run of d on nodes nodes.
func checkNetStep(t *testing.T, s Step, nodes int, d time.Duration) {
	t.Helper()
	valid := func(id int) bool { return id >= 1 && id <= nodes }
	if s.For < netMin || s.For > netMaxFor(d) || (s.Net != NetDrop && s.Net != NetReset) {
		t.Fatalf("step %v: lasts %s (want %s..%s), kind %q", s, s.For, netMin, netMaxFor(d), s.Net)
	}
	c := s.Cut(nodes)
	seen := map[int]bool{}
	for _, id := range slices.Concat(c.A, c.B) {
		if !valid(id) || seen[id] {
			t.Fatalf("step %v: cut %+v names a node twice or out of 1..%d", s, c, nodes)
		}
		seen[id] = true
	}
	switch s.Action {
	case ActNetPeers, ActNetIsolate:
		if !valid(s.Node) || !slices.Equal(c.A, []int{s.Node}) || len(c.B) != nodes-1 {
			t.Fatalf("step %v: cut %+v", s, c)
		}
		if (s.Action == ActNetIsolate) != slices.Equal(c.Etcd, []int{s.Node}) {
			t.Fatalf("step %v: etcd cut %v", s, c.Etcd)
		}
	case ActNetEtcd:
		if !valid(s.Node) || len(c.A)+len(c.B) != 0 || !slices.Equal(c.Etcd, []int{s.Node}) {
			t.Fatalf("step %v: cut %+v", s, c)
		}
	case ActNetHalves:
		if len(s.Side) < 1 || 2*len(s.Side) >= nodes+1 && nodes > 2 || len(c.A)+len(c.B) != nodes || len(c.Etcd) != 0 {
			t.Fatalf("step %v: not a minority: %+v", s, c)
		}
	case ActNetBridge:
		if !valid(s.Node) || seen[s.Node] || len(c.A) == 0 || len(c.B) == 0 || len(c.A)+len(c.B) != nodes-1 || len(c.Etcd) != 0 {
			t.Fatalf("step %v: not a bridge: %+v", s, c)
		}
	default:
		t.Fatalf("step %v: not a network action", s)
	}
	if !slices.IsSorted(s.Side) {
		t.Fatalf("step %v: side not sorted", s)
	}
}

func TestPlanAllowedActions(t *testing.T) {
	for _, s := range Plan(7, 2*time.Minute, 3, 4*time.Second, []Action{ActPauseEtcd}) {
		if s.Action != ActPauseEtcd {
			t.Fatalf("step %v: only pause-etcd allowed", s)
		}
	}
	if s := Plan(7, 2*time.Minute, 3, 4*time.Second, nil); len(s) != 0 {
		t.Fatalf("no action allowed, planned %v", s)
	}
}

func TestParseActions(t *testing.T) {
	tests := []struct {
		in   string
		want []Action
		bad  bool
	}{
		{in: "all", want: Actions},
		{in: "none"},
		{in: ""},
		{in: "kill, stop,kill", want: []Action{ActKill, ActStop}},
		{in: "kill,explode", bad: true},
		{in: "net-halves,kill", want: []Action{ActNetHalves, ActKill}},
		{in: "kill-source,kill-destination", want: []Action{ActKillSource, ActKillDestination}},
		{in: "kill-rejoin-dest,kill-destination,kill-rejoin-source", want: []Action{ActKillDestination, ActKillSource}},
	}
	for _, tt := range tests {
		got, err := ParseActions(tt.in)
		if (err != nil) != tt.bad || !slices.Equal(got, tt.want) {
			t.Errorf("ParseActions(%q) = %v, %v; want %v (error %v)", tt.in, got, err, tt.want, tt.bad)
		}
	}
}
