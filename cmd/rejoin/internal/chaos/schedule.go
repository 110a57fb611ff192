package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Action is one kind of fault of the nemesis.
type Action string

// The nemesis's faults.
const (
	// ActKill SIGKILLs a node and restarts it after Step.For, from 0 s
	// (quicker than its lease) to KillDownMax.
	ActKill Action = "kill"
	// ActStop SIGSTOPs a node past its TTL, SIGCONTs it after Step.For.
	ActStop Action = "stop"
	// ActKillSource and ActKillDest SIGKILL the source or the destination
	// of a rejoin in progress (the Pick-th one seen, modulo their count)
	// and restart it after Step.For.
	ActKillSource Action = "kill-rejoin-source"
	ActKillDest   Action = "kill-rejoin-dest"
	// ActPauseEtcd SIGSTOPs etcd for Step.For (1 to 6 s).
	ActPauseEtcd Action = "pause-etcd"
)

// The schedule's bounds.
const (
	gapMin       = 1 * time.Second // between two faults
	gapMax       = 6 * time.Second
	KillDownMax  = 10 * time.Second
	stopPastTTL  = 4 * time.Second // a stop lasts the TTL plus up to this
	etcdPauseMin = 1 * time.Second
	etcdPauseMax = 6 * time.Second
	// stepsMax bounds a schedule, whatever its duration.
	stepsMax = 10_000
)

// Step is one fault of the schedule: at At from the nemesis's start, do
// Action to node Node (ActKill, ActStop) or to the Pick-th rejoin in
// progress, for For.
type Step struct {
	At     time.Duration `json:"at"`
	Action Action        `json:"action"`
	Node   int           `json:"node,omitempty"`
	Pick   int           `json:"pick,omitempty"`
	For    time.Duration `json:"for"`
}

func (s Step) String() string {
	at := fmt.Sprintf("+%6.2fs", s.At.Seconds())
	switch s.Action {
	case ActKill:
		return fmt.Sprintf("%s kill n%d, restart after %.2fs", at, s.Node, s.For.Seconds())
	case ActStop:
		return fmt.Sprintf("%s stop n%d for %.2fs", at, s.Node, s.For.Seconds())
	case ActKillSource, ActKillDest:
		return fmt.Sprintf("%s %s (pick %d), restart after %.2fs", at, s.Action, s.Pick, s.For.Seconds())
	case ActPauseEtcd:
		return fmt.Sprintf("%s pause etcd for %.2fs", at, s.For.Seconds())
	}
	return fmt.Sprintf("%s %s", at, s.Action)
}

// Actions lists every action, in the order Plan weighs them.
var Actions = []Action{ActKill, ActStop, ActKillSource, ActKillDest, ActPauseEtcd}

// weight is each action's share of the schedule.
var weight = map[Action]int{ActKill: 35, ActStop: 20, ActKillSource: 15, ActKillDest: 15, ActPauseEtcd: 15}

// Plan is the nemesis's schedule for a run of d on nodes nodes whose
// lease TTL is ttl, drawing among the actions allowed (none: an empty
// schedule): a pure function of its arguments, so the same seed replays
// the same schedule. Whether a step can run (its node up, no last live
// replica hit, a rejoin in progress) is decided when it comes; the run
// says which it skipped and why.
func Plan(seed int64, d time.Duration, nodes int, ttl time.Duration, allowed []Action) []Step {
	total := 0
	for _, a := range allowed {
		total += weight[a]
	}
	if total == 0 || nodes < 1 {
		return nil
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x6368616f73)) // "chaos"
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)/int64(time.Millisecond)+1))*time.Millisecond
	}
	var steps []Step
	at := time.Duration(0)
	for len(steps) < stepsMax {
		at += between(gapMin, gapMax)
		if at >= d {
			break
		}
		s := Step{At: at}
		x := rng.IntN(total)
		for _, a := range allowed {
			if x < weight[a] {
				s.Action = a
				break
			}
			x -= weight[a]
		}
		switch s.Action {
		case ActKill:
			s.Node, s.For = 1+rng.IntN(nodes), between(0, KillDownMax)
		case ActStop:
			s.Node, s.For = 1+rng.IntN(nodes), ttl+between(500*time.Millisecond, stopPastTTL)
		case ActKillSource, ActKillDest:
			s.Pick, s.For = rng.IntN(nodes*4), between(0, KillDownMax)
		case ActPauseEtcd:
			s.For = between(etcdPauseMin, etcdPauseMax)
		}
		steps = append(steps, s)
	}
	return steps
}

// ParseActions parses a comma-separated list of actions; "all" is every
// one, "none" or "" none.
func ParseActions(s string) ([]Action, error) {
	switch s {
	case "all":
		return slices.Clone(Actions), nil
	case "none", "":
		return nil, nil
	}
	var out []Action
	for _, f := range strings.Split(s, ",") {
		a := Action(strings.TrimSpace(f))
		if !slices.Contains(Actions, a) {
			return nil, fmt.Errorf("chaos: unknown fault %q (want all, none, or some of %v)", a, Actions)
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}
