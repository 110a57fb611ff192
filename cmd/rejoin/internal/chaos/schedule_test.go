package chaos

import (
	"slices"
	"testing"
	"time"
)

func TestPlanIsAFunctionOfTheSeed(t *testing.T) {
	const d, ttl = 3 * time.Minute, 4 * time.Second
	a := Plan(42, d, 5, ttl, Actions)
	if b := Plan(42, d, 5, ttl, Actions); !slices.Equal(a, b) {
		t.Fatalf("the same seed planned two schedules:\n%v\n%v", a, b)
	}
	if c := Plan(43, d, 5, ttl, Actions); slices.Equal(a, c) {
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
		case (s.Action == ActKill || s.Action == ActKillSource || s.Action == ActKillDest) && (s.For < 0 || s.For > KillDownMax):
			t.Fatalf("step %v: downtime out of 0..%s", s, KillDownMax)
		case s.Action == ActPauseEtcd && (s.For < etcdPauseMin || s.For > etcdPauseMax):
			t.Fatalf("step %v: etcd pause out of %s..%s", s, etcdPauseMin, etcdPauseMax)
		}
		last = s.At
	}
	if len(seen) != len(Actions) {
		t.Fatalf("3 minutes drew only %v", seen)
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
	}
	for _, tt := range tests {
		got, err := ParseActions(tt.in)
		if (err != nil) != tt.bad || !slices.Equal(got, tt.want) {
			t.Errorf("ParseActions(%q) = %v, %v; want %v (error %v)", tt.in, got, err, tt.want, tt.bad)
		}
	}
}
