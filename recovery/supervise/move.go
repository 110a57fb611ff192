package supervise

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
)

// A membership move takes one partition's replica off one node (From)
// and onto another (To) while both run (docs/DESIGN.md "Membership
// moves"): a replica record for To is added, needs-rejoin, with a move
// record naming both; To's node creates the replica, which is rebuilt by
// a normal rejoin (the same claims, fencing and supervision as a
// restart; From, still live, may be its source); once it is live, From's
// record is removed (FinishMove), and From's node drops its replica. The
// add comes before the remove, so no partition ever has fewer live
// replicas than before its move.
//
// What follows is the pure part: which moves to start (PlanDrain,
// PlanRebalance) and whether a move may end (CheckFinish). The etcd
// writes are in move_etcd.go.

// Move is one membership move of partition Partition from From to To.
type Move struct {
	Partition uint32    `json:"-"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Started   time.Time `json:"started"`
	// LiveBefore is how many live replicas the partition had when the
	// move started: the remove waits until it has as many without From.
	LiveBefore int `json:"live_before"`
}

func (m Move) String() string { return fmt.Sprintf("partition %d %s→%s", m.Partition, m.From, m.To) }

// ErrMove classifies a move the planner or FinishMove refuses: no node
// can take a replica, a node that is not running, a remove that would
// leave a partition fewer live replicas.
var ErrMove = errors.New("supervise: move refused")

// ErrMoveNotReady: the move's new replica is not live yet; ask again.
var ErrMoveNotReady = errors.New("supervise: move not ready")

// MoveState is what the planner reads: the registered nodes, the
// placement and the moves under way. Nothing else, so a state written
// down replays a plan.
type MoveState struct {
	Nodes    map[string]NodeRecord // registered (running) nodes
	Replicas map[uint32][]Replica  // the placement, by partition
	Moves    map[uint32]Move       // the moves under way, by partition
}

// MoveLimits bound what a plan starts.
type MoveLimits struct {
	// InFlightMax bounds the moves under way at once, across the cluster:
	// 1 moves one partition at a time.
	InFlightMax int
	// IncomingMax bounds the moves under way onto one node: each is a
	// rejoin onto it, which the node takes at most its --incoming-max of
	// at once anyway.
	IncomingMax int
}

// MoveInFlightMaxDefault and MoveIncomingMaxDefault are the limits' defaults.
const (
	MoveInFlightMaxDefault = 1
	MoveIncomingMaxDefault = 2
)

func (l MoveLimits) check() error {
	if l.InFlightMax < 1 || l.IncomingMax < 1 {
		return fmt.Errorf("%w: move limits %d in flight, %d incoming: each must be at least 1", ErrConfig, l.InFlightMax, l.IncomingMax)
	}
	return nil
}

// hosts reports whether node holds a replica of p in s.
func (s MoveState) hosts(p uint32, node string) bool {
	return slices.ContainsFunc(s.Replicas[p], func(r Replica) bool { return r.Node == node })
}

// counts is each running node's replicas, with those moving off it
// counted gone and those moving onto it counted there (their records are
// in the placement already).
func (s MoveState) counts() map[string]int {
	c := make(map[string]int, len(s.Nodes))
	for id := range s.Nodes {
		c[id] = 0
	}
	for _, reps := range s.Replicas {
		for _, r := range reps {
			if _, ok := c[r.Node]; ok {
				c[r.Node]++
			}
		}
	}
	for _, m := range s.Moves {
		if _, ok := c[m.From]; ok {
			c[m.From]--
		}
	}
	return c
}

// room says how many more moves may start, and each node's moves in.
func (s MoveState) room(lim MoveLimits) (int, map[string]int) {
	in := map[string]int{}
	for _, m := range s.Moves {
		in[m.To]++
	}
	return lim.InFlightMax - len(s.Moves), in
}

// takers lists the running, ready nodes in order of fewest replicas
// (counts), ties by id.
func takers(s MoveState, counts map[string]int) []string {
	var out []string
	for id, n := range s.Nodes {
		if n.Status == NodeReady {
			out = append(out, id)
		}
	}
	slices.SortFunc(out, func(x, y string) int { return cmp.Or(cmp.Compare(counts[x], counts[y]), cmp.Compare(x, y)) })
	return out
}

// PlanDrain returns the moves to start now so that node ends up with no
// replica, within lim, and whether the drain is done (no replica left on
// node and no move under way). Each partition node holds goes to the
// running node with the fewest replicas that holds none of it yet. A
// partition that no node can take is an error (ErrMove), before any move:
// the drain would stall on it.
func PlanDrain(s MoveState, node string, lim MoveLimits) ([]Move, bool, error) {
	if err := lim.check(); err != nil {
		return nil, false, err
	}
	var off []uint32
	for p := range s.Replicas {
		if s.hosts(p, node) {
			off = append(off, p)
		}
	}
	slices.Sort(off)
	if len(off) == 0 && len(s.Moves) == 0 {
		return nil, true, nil
	}
	counts := s.counts()
	left, in := s.room(lim)
	var out []Move
	for _, p := range off {
		if _, moving := s.Moves[p]; moving {
			continue
		}
		var to string
		var full bool
		for _, id := range takers(s, counts) {
			if id == node || s.hosts(p, id) {
				continue
			}
			if in[id] >= lim.IncomingMax {
				full = true
				continue
			}
			to = id
			break
		}
		if to == "" && !full {
			return nil, false, fmt.Errorf("%w: no running node can take partition %d off %s (every other one holds it already, or none runs): add a node first", ErrMove, p, node)
		}
		if to == "" || left <= 0 {
			continue
		}
		out = append(out, Move{Partition: p, From: node, To: to})
		counts[to]++
		in[to]++
		left--
	}
	return out, false, nil
}

// PlanRebalance returns the moves to start now so that the running nodes
// end up holding replica counts within one of each other, within lim, and
// whether the cluster is balanced (within one, no move under way). Each
// move takes the lowest partition that the node with the most replicas
// (the highest id among equals) holds and the one with the fewest (the
// lowest id among equals) does not; it moves replicas between
// running nodes only (a dead node's are `rejoin replace`'s).
func PlanRebalance(s MoveState, lim MoveLimits) ([]Move, bool, error) {
	if err := lim.check(); err != nil {
		return nil, false, err
	}
	counts := s.counts()
	left, in := s.room(lim)
	moving := map[uint32]bool{}
	for p := range s.Moves {
		moving[p] = true
	}
	var out []Move
	for left > 0 {
		order := takers(s, counts)
		if len(order) < 2 {
			break
		}
		from := order[len(order)-1]
		var m Move
		for _, to := range order[:len(order)-1] {
			if counts[from]-counts[to] <= 1 {
				break
			}
			if in[to] >= lim.IncomingMax {
				continue
			}
			if p, ok := movable(s, from, to, moving); ok {
				m = Move{Partition: p, From: from, To: to}
				break
			}
		}
		if m.To == "" {
			break
		}
		out = append(out, m)
		moving[m.Partition] = true
		counts[m.From]--
		counts[m.To]++
		in[m.To]++
		left--
	}
	if len(out) > 0 || len(s.Moves) > 0 {
		return out, false, nil
	}
	order := takers(s, counts)
	return nil, len(order) < 2 || counts[order[len(order)-1]]-counts[order[0]] <= 1, nil
}

// movable returns the lowest partition that from holds, to does not, and
// no move touches.
func movable(s MoveState, from, to string, moving map[uint32]bool) (uint32, bool) {
	var best uint32
	found := false
	for p := range s.Replicas {
		if moving[p] || !s.hosts(p, from) || s.hosts(p, to) {
			continue
		}
		if !found || p < best {
			best, found = p, true
		}
	}
	return best, found
}

// CheckFinish says whether move m may end now, its old replica's record
// removed: nil if so. The new replica must be live on a running node
// (else ErrMoveNotReady), and without From the partition must keep at
// least the m.LiveBefore live replicas it had when the move started (else
// ErrMove): a replica of the partition that failed meanwhile keeps From's
// in place until it is back, so a remove never leaves a partition fewer
// live replicas than before its move.
func CheckFinish(reps []Replica, nodes map[string]NodeRecord, m Move) error {
	toLive, after := false, 0
	for _, r := range reps {
		_, up := nodes[r.Node]
		live := up && r.State == recovery.ReplicaLive
		if r.Node == m.To {
			toLive = live
		}
		if r.Node != m.From && live {
			after++
		}
	}
	switch {
	case !toLive:
		return fmt.Errorf("%w: %s: the replica on %s is not live yet", ErrMoveNotReady, m, m.To)
	case after < m.LiveBefore:
		return fmt.Errorf("%w: %s: without %s's replica the partition would have %d live replicas, fewer than the %d before the move; waiting for the others", ErrMoveNotReady, m, m.From, after, m.LiveBefore)
	}
	return nil
}

// LiveReplicas counts the live replicas of reps on running nodes.
func LiveReplicas(reps []Replica, nodes map[string]NodeRecord) int {
	n := 0
	for _, r := range reps {
		if _, up := nodes[r.Node]; up && r.State == recovery.ReplicaLive {
			n++
		}
	}
	return n
}
