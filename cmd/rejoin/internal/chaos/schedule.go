package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
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
	// ActKillSource and ActKillDestination SIGKILL the source or the
	// destination of a rejoin in progress (the Pick-th one seen, modulo
	// their count) and restart it after Step.For. Named as the demo's
	// faults of the same kind.
	ActKillSource      = Action(demo.FaultKillSource)
	ActKillDestination = Action(demo.FaultKillDestination)
	// ActPauseEtcd SIGSTOPs etcd for Step.For (1 to 6 s).
	ActPauseEtcd = Action(demo.FaultPauseEtcd)

	// The network faults (netfault.go): for Step.For, packets between
	// node processes, or between a node and etcd, are dropped or reset
	// by the kernel (Step.Net).
	//
	// ActNetPeers cuts node Step.Node from every other node.
	ActNetPeers Action = "net-peers"
	// ActNetEtcd cuts node Step.Node from etcd.
	ActNetEtcd Action = "net-etcd"
	// ActNetIsolate cuts node Step.Node from its peers and from etcd.
	ActNetIsolate Action = "net-isolate"
	// ActNetHalves cuts the nodes Step.Side (a minority) from the others;
	// both halves still reach etcd.
	ActNetHalves Action = "net-halves"
	// ActNetBridge cuts Step.Side from the nodes that are neither in it
	// nor Step.Node, the bridge, which sees both halves.
	ActNetBridge Action = "net-bridge"
)

// NetKind is how a network fault treats the packets it matches.
type NetKind string

const (
	// NetDrop drops them: connections stall until the fault ends or
	// their own timeouts fire.
	NetDrop NetKind = "drop"
	// NetReset rejects them with a TCP reset: each connection is reset
	// at its next segment, and new ones are refused.
	NetReset NetKind = "reset"
)

// IsNet reports whether a is a network fault.
func (a Action) IsNet() bool {
	switch a {
	case ActNetPeers, ActNetEtcd, ActNetIsolate, ActNetHalves, ActNetBridge:
		return true
	}
	return false
}

// The schedule's bounds.
const (
	gapMin       = 1 * time.Second // between two faults
	gapMax       = 6 * time.Second
	KillDownMax  = 10 * time.Second
	stopPastTTL  = 4 * time.Second // a stop lasts the TTL plus up to this
	etcdPauseMin = 1 * time.Second
	etcdPauseMax = 6 * time.Second
	// A network fault lasts netMin to netMaxFor the run's duration.
	netMin = 2 * time.Second
	netMax = 30 * time.Second
	// stepsMax bounds a schedule, whatever its duration.
	stepsMax = 10_000
)

// netMaxFor is the longest network fault of a run of d: a sixth of it,
// within netMin..netMax, so that a short run still has time between its
// faults (3 minutes: up to 30 s; 90 s: up to 15 s).
func netMaxFor(d time.Duration) time.Duration { return min(max(d/6, netMin), netMax) }

// Step is one fault of the schedule: at At from the nemesis's start, do
// Action to node Node (ActKill, ActStop, ActNetPeers, ActNetEtcd,
// ActNetIsolate; the bridge of ActNetBridge), to the nodes Side
// (ActNetHalves, ActNetBridge) or to the Pick-th rejoin in progress, for
// For; a network fault's packets are treated as Net says.
type Step struct {
	At     time.Duration `json:"at"`
	Action Action        `json:"action"`
	Node   int           `json:"node,omitempty"`
	Side   []int         `json:"side,omitempty"`
	Net    NetKind       `json:"net,omitempty"`
	Pick   int           `json:"pick,omitempty"`
	For    time.Duration `json:"for"`
}

// Equal reports whether s and o are the same step.
func (s Step) Equal(o Step) bool {
	return s.At == o.At && s.Action == o.Action && s.Node == o.Node && slices.Equal(s.Side, o.Side) &&
		s.Net == o.Net && s.Pick == o.Pick && s.For == o.For
}

// Cut is what a network fault cuts among nodes 1..nodes: every node of
// A from every node of B, and the nodes Etcd from etcd.
type Cut struct {
	A, B []int
	Etcd []int
}

// Cut is the cut of network step s in a cluster of nodes nodes; the
// zero Cut for another action.
func (s Step) Cut(nodes int) Cut {
	others := func(out ...int) []int {
		var o []int
		for id := 1; id <= nodes; id++ {
			if !slices.Contains(out, id) {
				o = append(o, id)
			}
		}
		return o
	}
	switch s.Action {
	case ActNetPeers:
		return Cut{A: []int{s.Node}, B: others(s.Node)}
	case ActNetEtcd:
		return Cut{Etcd: []int{s.Node}}
	case ActNetIsolate:
		return Cut{A: []int{s.Node}, B: others(s.Node), Etcd: []int{s.Node}}
	case ActNetHalves:
		return Cut{A: slices.Clone(s.Side), B: others(s.Side...)}
	case ActNetBridge:
		return Cut{A: slices.Clone(s.Side), B: others(append([]int{s.Node}, s.Side...)...)}
	}
	return Cut{}
}

// CutOff are the nodes a network step leaves on the short side: the
// node cut from its peers or etcd, a minority half, and the side of a
// bridge the nodes fence (docs/DESIGN.md "A cut between two nodes"): the
// smaller, which the other side and the bridge report, a majority; of
// two of one size, the one with the greatest node id, as
// supervise.CutDue breaks its ties.
func (s Step) CutOff(nodes int) []int {
	c := s.Cut(nodes)
	switch s.Action {
	case ActNetHalves:
		return c.A
	case ActNetBridge:
		a, b := slices.Clone(c.A), slices.Clone(c.B)
		slices.Sort(a)
		slices.Sort(b)
		if len(b) < len(a) || len(a) == len(b) && b[len(b)-1] > a[len(a)-1] {
			a = b
		}
		return a
	}
	out := slices.Concat(c.A, c.Etcd)
	slices.Sort(out)
	return slices.Compact(out)
}

// BridgeOther is, for a bridge, the side CutOff does not name: which
// side the nodes fence depends on the reports, and with another fault on
// top, on its timing too (Window.Other). Nil for other steps.
func (s Step) BridgeOther(nodes int) []int {
	if s.Action != ActNetBridge {
		return nil
	}
	c := s.Cut(nodes)
	off := s.CutOff(nodes)
	var out []int
	for _, id := range slices.Concat(c.A, c.B) {
		if !slices.Contains(off, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func nodeSet(ids []int) string {
	ss := make([]string, len(ids))
	for i, id := range ids {
		ss[i] = fmt.Sprintf("n%d", id)
	}
	return "{" + strings.Join(ss, ",") + "}"
}

// NetString names a network step's cut, as the run's log lines do:
// "drop n2<->peers".
func (s Step) NetString(nodes int) string {
	switch s.Action {
	case ActNetPeers:
		return fmt.Sprintf("%s n%d<->peers", s.Net, s.Node)
	case ActNetEtcd:
		return fmt.Sprintf("%s n%d<->etcd", s.Net, s.Node)
	case ActNetIsolate:
		return fmt.Sprintf("%s n%d<->peers+etcd", s.Net, s.Node)
	case ActNetHalves, ActNetBridge:
		c := s.Cut(nodes)
		str := fmt.Sprintf("%s %s<->%s", s.Net, nodeSet(c.A), nodeSet(c.B))
		if s.Action == ActNetBridge {
			str += fmt.Sprintf(" (bridge n%d)", s.Node)
		}
		return str
	}
	return string(s.Action)
}

func (s Step) String() string {
	at := fmt.Sprintf("+%6.2fs", s.At.Seconds())
	switch s.Action {
	case ActKill:
		return fmt.Sprintf("%s kill n%d, restart after %.2fs", at, s.Node, s.For.Seconds())
	case ActStop:
		return fmt.Sprintf("%s stop n%d for %.2fs", at, s.Node, s.For.Seconds())
	case ActKillSource, ActKillDestination:
		return fmt.Sprintf("%s %s (pick %d), restart after %.2fs", at, s.Action, s.Pick, s.For.Seconds())
	case ActPauseEtcd:
		return fmt.Sprintf("%s pause etcd for %.2fs", at, s.For.Seconds())
	case ActNetPeers, ActNetEtcd, ActNetIsolate:
		return fmt.Sprintf("%s %s %s n%d for %.2fs", at, s.Action, s.Net, s.Node, s.For.Seconds())
	case ActNetHalves:
		return fmt.Sprintf("%s %s %s %s from the rest for %.2fs", at, s.Action, s.Net, nodeSet(s.Side), s.For.Seconds())
	case ActNetBridge:
		return fmt.Sprintf("%s %s %s %s from the rest but bridge n%d for %.2fs", at, s.Action, s.Net, nodeSet(s.Side), s.Node, s.For.Seconds())
	}
	return fmt.Sprintf("%s %s", at, s.Action)
}

// Actions lists every action, in the order Plan weighs them.
var Actions = []Action{ActKill, ActStop, ActKillSource, ActKillDestination, ActPauseEtcd,
	ActNetPeers, ActNetEtcd, ActNetIsolate, ActNetHalves, ActNetBridge}

// weight is each action's share of the schedule: the process faults 100,
// the network faults 60.
var weight = map[Action]int{ActKill: 35, ActStop: 20, ActKillSource: 15, ActKillDestination: 15, ActPauseEtcd: 15,
	ActNetPeers: 15, ActNetEtcd: 10, ActNetIsolate: 10, ActNetHalves: 15, ActNetBridge: 10}

// WithoutNet is as minus its network faults.
func WithoutNet(as []Action) []Action {
	return slices.DeleteFunc(slices.Clone(as), Action.IsNet)
}

// Plan is the nemesis's schedule for a run of d on nodes nodes whose
// lease TTL is ttl, drawing among the actions allowed (none: an empty
// schedule): a pure function of its arguments, so the same seed replays
// the same schedule. Whether a step can run (its node up, no last live
// replica hit, a rejoin in progress) is decided when it comes; the run
// says which it skipped and why.
func Plan(seed int64, d time.Duration, nodes int, ttl time.Duration, allowed []Action) []Step {
	if nodes < 3 {
		// A bridge needs a node and two sides.
		allowed = slices.DeleteFunc(slices.Clone(allowed), func(a Action) bool { return a == ActNetBridge })
	}
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
		case ActKillSource, ActKillDestination:
			s.Pick, s.For = rng.IntN(nodes*4), between(0, KillDownMax)
		case ActPauseEtcd:
			s.For = between(etcdPauseMin, etcdPauseMax)
		case ActNetPeers, ActNetEtcd, ActNetIsolate:
			s.Node = 1 + rng.IntN(nodes)
		case ActNetHalves:
			// A minority: 1 to (nodes-1)/2 nodes (1 of 2 or 3).
			perm := rng.Perm(nodes)
			s.Side = sortedIDs(perm[:1+rng.IntN(max(1, (nodes-1)/2))])
		case ActNetBridge:
			// The bridge, then the rest split in two non-empty sides.
			perm := rng.Perm(nodes)
			s.Node = 1 + perm[0]
			s.Side = sortedIDs(perm[1 : 2+rng.IntN(nodes-2)])
		}
		if s.Action.IsNet() {
			s.For = between(netMin, netMaxFor(d))
			s.Net = NetDrop
			if rng.IntN(2) == 0 {
				s.Net = NetReset
			}
		}
		steps = append(steps, s)
	}
	return steps
}

// sortedIDs are the node ids of 0-based indexes, sorted.
func sortedIDs(idx []int) []int {
	out := make([]int, len(idx))
	for i, x := range idx {
		out[i] = x + 1
	}
	slices.Sort(out)
	return out
}

// renamed takes the names the rejoin kills had before they were named as
// the demo's, so a script written then runs the same faults.
var renamed = map[Action]Action{"kill-rejoin-source": ActKillSource, "kill-rejoin-dest": ActKillDestination}

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
		if now, ok := renamed[a]; ok {
			a = now
		}
		if !slices.Contains(Actions, a) {
			return nil, fmt.Errorf("chaos: unknown fault %q (want all, none, or some of %v)", a, Actions)
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}
