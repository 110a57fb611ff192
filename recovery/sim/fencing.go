package sim

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// The fence decision, seeded (docs/DESIGN.md "Fencing by the peers'
// word", "A cut between two nodes", "A process that starts cut off").
// Nodes hear one another or not as the network faults of a seed say;
// each reports the processes it has not heard for suspectAfter (a killed
// one sooner: EndedAfter), fences
// what its supervise.Fencer names by the guarded transaction's rule
// (supervise.FenceNode: every record it read unchanged), and, not
// registered, registers once supervise.MayRegister lets it, on the nodes
// it reaches both ways. etcd is one Membership that every node reads a
// tick or two late. The run checks what the rules promise: a cut's fence
// never leaves less than a majority registered; a fault that leaves a
// majority able to hear one another ends, within a bound, with the
// registered nodes all hearing one another (the partitions served); no
// node fenced more than twice while the faults stand as they are; and
// after the last heal, every node
// registered and no report standing. The rest of a rejoin is the main
// simulator's: this is the membership alone.

// FenceKnobs shape a fencing run. Times are ticks of the fence loop's
// period (100 ms).
type FenceKnobs struct {
	// Nodes is the cluster's size (3 to 7).
	Nodes int
	// Faults is how many faults come one after another, each lasting
	// 2 to 30 s with a pause of up to 10 s between.
	Faults int
	// SuspectAfter, CutAfter, TryEvery: the node's suspectAfter,
	// cutAfter and fenceTryEvery; TTL the registration lease's.
	// EndedAfter: how long a killed process goes unreported, its
	// connections ended and its record standing still (the node's
	// recordQuiet, endedAndQuiet).
	SuspectAfter, CutAfter, TryEvery, TTL, EndedAfter int
	// ViewLagMax bounds how many ticks a node's view of etcd lags.
	ViewLagMax int
	// OverlapPct is the chance that a fault comes on top of the one
	// before it.
	OverlapPct int
	// Bound is how long after a fault's start the registered nodes must
	// hear one another again, if a majority can; HealBound how long after
	// the last heal every node must be registered with no report left.
	Bound, HealBound int
}

// DefaultFenceKnobs are the node's defaults, in ticks.
func DefaultFenceKnobs() FenceKnobs {
	return FenceKnobs{Nodes: 5, Faults: 4, SuspectAfter: 15, CutAfter: 5, TryEvery: 5, TTL: 30, EndedAfter: 6, ViewLagMax: 2, OverlapPct: 30,
		Bound: 50, HealBound: 80}
}

// FenceResult is a fencing run's outcome: Err the first broken promise,
// Trace what happened, and what the run measured.
type FenceResult struct {
	Seed   uint64
	Err    error
	Trace  []string
	Fences int
	// CutFences counts the fences of supervise.CutDue's picks.
	CutFences int
	// Resolved counts the faults resolved within Bound that had to be;
	// ResolveMax is the longest it took, in ticks from the fault's start.
	Resolved, ResolveMax int
}

// fenceShape is a fault's kind.
type fenceShape int

const (
	shapeIsolate fenceShape = iota // one node from its peers, both ways
	shapeLink                      // one link, both ways
	shapeOneWay                    // one link, one way
	shapeSplit                     // a minority from the rest
	shapeBridge                    // two sides, each reaching a third
	shapePause                     // one process stopped
	shapeKill                      // one process killed, a new one later
	shapesN
)

func (s fenceShape) String() string {
	return [...]string{"isolate", "link", "one-way", "split", "bridge", "pause", "kill"}[s]
}

// fenceFault is one fault: cut[a][b] says a's messages do not reach b.
type fenceFault struct {
	shape      fenceShape
	start, end int
	cut        [][]bool
	node       int // paused or killed
	desc       string
	// alone: no other fault overlaps it; clean: it began on a cluster
	// with every node registered and no report standing.
	alone, clean bool
}

type fenceNode struct {
	id string
	// viewAt is the tick whose end its last view was: views only move on.
	viewAt  int
	started int64 // the process, in Unix nanoseconds (a restart: a new one)
	dead    bool
	paused  bool
	stopped int // tick the process last stopped (paused or killed)
	f       *supervise.Fencer
	// regAt is when this process last registered.
	regAt int
	// heard[b]: the last tick this node heard b's current process;
	// seen[b@created]: the first tick its view held that registration.
	heard []int
	seen  map[string]int
	// fencedIn counts this process's fences since a fault last began or
	// healed.
	fencedIn int
	// atOnce are the registrations (node@created) its gate counted its
	// report on: reported at once, until heard.
	atOnce map[string]bool
}

type fencing struct {
	k     FenceKnobs
	rng   *rand.Rand
	tick  int
	rev   int64
	nodes []*fenceNode
	m     *supervise.Membership
	hist  []*supervise.Membership // hist[i]: m at the end of tick tick-1-i
	res   *FenceResult
	// resolvedAt is the first tick since a fault last began or healed
	// that the registered nodes all heard one another (0: not yet).
	resolvedAt int
}

// RunFencing runs the fence decision under seed's faults.
func RunFencing(seed uint64, k FenceKnobs) (res FenceResult) {
	res.Seed = seed
	w := &fencing{k: k, rng: rand.New(rand.NewPCG(seed, 0xfe0ce)), res: &res,
		m: &supervise.Membership{Nodes: map[string]supervise.NodeRecord{}, Replicas: map[string]supervise.Replica{},
			Reports: map[string]supervise.Report{}, Fences: map[string]supervise.Fence{}}}
	for i := range k.Nodes {
		n := &fenceNode{id: fmt.Sprintf("n%d", i+1), started: int64(i+1) * int64(time.Second), heard: make([]int, k.Nodes), seen: map[string]int{}}
		n.f = w.fencer(n.id)
		w.nodes = append(w.nodes, n)
		w.register(n)
		// The cluster counts every node holding a replica (tally).
		w.m.Replicas[supervise.ReplicaKey(uint32(i), n.id)] = supervise.Replica{Partition: uint32(i), Node: n.id, State: recovery.ReplicaLive}
	}
	faults := w.drawFaults()
	healed := 0
	for _, f := range faults {
		healed = max(healed, f.end)
	}
	end := healed + k.HealBound
	for w.tick = 1; w.tick <= end; w.tick++ {
		for _, f := range faults {
			if f.start == w.tick {
				w.begin(f)
			}
			if f.end == w.tick {
				w.heal(f)
			}
		}
		cut := w.cutNow(faults)
		w.hear(cut)
		w.expire()
		for _, i := range w.rng.Perm(len(w.nodes)) {
			if err := w.step(w.nodes[i]); err != nil {
				res.Err = err
				return res
			}
		}
		w.hist = append([]*supervise.Membership{cloneMembership(w.m)}, w.hist...)
		if len(w.hist) > k.ViewLagMax+1 {
			w.hist = w.hist[:k.ViewLagMax+1]
		}
		if err := w.check(faults, cut); err != nil {
			res.Err = err
			return res
		}
	}
	return res
}

// fencer is a new process's fence loop, with the node's settings.
func (w *fencing) fencer(id string) *supervise.Fencer {
	return supervise.NewFencer(id, w.dur(w.k.CutAfter), w.dur(w.k.TryEvery), false)
}

func (w *fencing) dur(ticks int) time.Duration { return time.Duration(ticks) * 100 * time.Millisecond }

func (w *fencing) now() time.Time { return time.Unix(0, 0).Add(w.dur(w.tick)) }

func (w *fencing) tracef(format string, args ...any) {
	w.res.Trace = append(w.res.Trace, fmt.Sprintf("%5d ", w.tick)+fmt.Sprintf(format, args...))
}

func (w *fencing) register(n *fenceNode) {
	w.rev++
	w.m.Nodes[n.id] = supervise.NodeRecord{ID: n.id, Started: time.Unix(0, n.started), Created: w.rev}
	delete(w.m.Fences, n.id)
	n.regAt = w.tick
}

// registered reports whether n's current process holds its record.
func (w *fencing) registered(n *fenceNode) bool {
	rec, ok := w.m.Nodes[n.id]
	return ok && rec.Started.UnixNano() == n.started
}

func (w *fencing) drawFaults() []*fenceFault {
	var out []*fenceFault
	at := 20 + w.rng.IntN(50)
	for range w.k.Faults {
		f := w.drawFault()
		f.start, f.end = at, at+20+w.rng.IntN(280)
		out = append(out, f)
		at = f.end + w.rng.IntN(100)
		if w.rng.IntN(100) < w.k.OverlapPct {
			// The next comes on top of this one, as chaos's do.
			at = f.start + 1 + w.rng.IntN(f.end-f.start)
		}
	}
	for _, f := range out {
		f.alone = !slices.ContainsFunc(out, func(g *fenceFault) bool { return g != f && g.start < f.end && f.start < g.end })
	}
	return out
}

func (w *fencing) drawFault() *fenceFault {
	n := len(w.nodes)
	f := &fenceFault{shape: fenceShape(w.rng.IntN(int(shapesN))), cut: make([][]bool, n)}
	for i := range f.cut {
		f.cut[i] = make([]bool, n)
	}
	both := func(a, b int) { f.cut[a][b], f.cut[b][a] = true, true }
	perm := w.rng.Perm(n)
	switch f.shape {
	case shapeIsolate:
		for b := range n {
			if b != perm[0] {
				both(perm[0], b)
			}
		}
		f.desc = fmt.Sprintf("n%d isolated from its peers", perm[0]+1)
	case shapeLink:
		both(perm[0], perm[1])
		f.desc = fmt.Sprintf("link n%d-n%d cut", perm[0]+1, perm[1]+1)
	case shapeOneWay:
		f.cut[perm[0]][perm[1]] = true
		f.desc = fmt.Sprintf("n%d's messages to n%d cut", perm[0]+1, perm[1]+1)
	case shapeSplit:
		minority := perm[:1+w.rng.IntN((n-1)/2)]
		for _, a := range minority {
			for _, b := range perm[len(minority):] {
				both(a, b)
			}
		}
		f.desc = fmt.Sprintf("%s split from the rest", nodeNames(minority))
	case shapeBridge:
		// Two sides and the bridge, which reaches both.
		rest := perm[1:]
		cutAt := 1 + w.rng.IntN(len(rest)-1)
		for _, a := range rest[:cutAt] {
			for _, b := range rest[cutAt:] {
				both(a, b)
			}
		}
		f.desc = fmt.Sprintf("%s cut from %s, n%d the bridge", nodeNames(rest[:cutAt]), nodeNames(rest[cutAt:]), perm[0]+1)
	case shapePause, shapeKill:
		f.node = perm[0]
		f.desc = fmt.Sprintf("n%d %s", perm[0]+1, map[fenceShape]string{shapePause: "paused", shapeKill: "killed"}[f.shape])
	}
	return f
}

func nodeNames(ids []int) string {
	var s []string
	for _, i := range ids {
		s = append(s, fmt.Sprintf("n%d", i+1))
	}
	return "{" + strings.Join(s, ",") + "}"
}

func (w *fencing) begin(f *fenceFault) {
	w.tracef("fault: %s", f.desc)
	w.resolvedAt = 0
	f.clean = len(w.m.Reports) == 0
	for _, n := range w.nodes {
		f.clean = f.clean && w.registered(n)
	}
	for _, n := range w.nodes {
		n.fencedIn = 0
	}
	switch f.shape {
	case shapePause:
		n := w.nodes[f.node]
		n.paused, n.stopped = true, w.tick
	case shapeKill:
		n := w.nodes[f.node]
		n.dead, n.stopped = true, w.tick
	}
}

func (w *fencing) heal(f *fenceFault) {
	w.tracef("healed: %s", f.desc)
	w.resolvedAt = 0
	for _, n := range w.nodes {
		n.fencedIn = 0
	}
	switch f.shape {
	case shapePause:
		w.nodes[f.node].paused = false
	case shapeKill:
		// A new process of the node, with a fencer of its own.
		n := w.nodes[f.node]
		n.dead = false
		n.started += int64(time.Hour)
		n.f = w.fencer(n.id)
		n.seen = map[string]int{}
		for b := range n.heard {
			n.heard[b] = 0
		}
	}
}

// cutNow is the network as the faults under way leave it.
func (w *fencing) cutNow(faults []*fenceFault) [][]bool {
	n := len(w.nodes)
	cut := make([][]bool, n)
	for a := range cut {
		cut[a] = make([]bool, n)
		for _, f := range faults {
			if f.start <= w.tick && w.tick < f.end {
				for b := range n {
					cut[a][b] = cut[a][b] || f.cut[a][b]
				}
			}
		}
	}
	return cut
}

// up reports whether n's process runs: it sends, and its loop turns.
func up(n *fenceNode) bool { return !n.dead && !n.paused }

// hear notes what reaches whom: a process stopped sends nothing, and one
// paused still receives (its kernel does), which it reads on waking.
func (w *fencing) hear(cut [][]bool) {
	for a, na := range w.nodes {
		for b, nb := range w.nodes {
			if a != b && !na.dead && up(nb) && !cut[b][a] {
				na.heard[b] = w.tick
			}
		}
	}
}

// expire ends the registrations of processes stopped for the lease's TTL,
// and the reports of processes dead as long, as etcd's leases do.
func (w *fencing) expire() {
	for _, n := range w.nodes {
		if up(n) || w.tick-n.stopped < w.k.TTL {
			continue
		}
		if rec, ok := w.m.Nodes[n.id]; ok && rec.Started.UnixNano() == n.started {
			delete(w.m.Nodes, n.id)
			w.tracef("%s: lease expired", n.id)
		}
		for key, r := range w.m.Reports {
			if r.Reporter == n.id {
				delete(w.m.Reports, key)
			}
		}
	}
}

// index is node id's place in w.nodes.
func (w *fencing) index(id string) int {
	return slices.IndexFunc(w.nodes, func(n *fenceNode) bool { return n.id == id })
}

// view is n's view of etcd this tick: up to ViewLagMax ticks late, and
// never older than its last.
func (w *fencing) view(n *fenceNode) *supervise.Membership {
	if len(w.hist) == 0 {
		return w.m
	}
	// hist[i] is the end of tick w.tick-1-i.
	i := w.rng.IntN(min(len(w.hist), max(1, w.tick-n.viewAt)))
	n.viewAt = w.tick - 1 - i
	return w.hist[i]
}

// step is one turn of n's loops: registered, its reports and fences;
// not, its registration gate.
func (w *fencing) step(n *fenceNode) error {
	if !up(n) {
		return nil
	}
	v := w.view(n)
	idx := slices.Index(w.nodes, n)
	if !w.registered(n) {
		var fed, unfed []string
		for id := range v.Nodes {
			if id == n.id {
				continue
			}
			b := w.index(id)
			// A HelloReach answered: a round trip, within the tick.
			if w.nodes[b].heard[idx] == w.tick && n.heard[b] == w.tick {
				fed = append(fed, id)
			} else {
				unfed = append(unfed, id)
			}
		}
		g, err := supervise.MayRegister(v, n.id, fed, unfed, false)
		if err != nil {
			return nil
		}
		n.atOnce = map[string]bool{}
		w.register(n)
		w.tracef("%s registers: %s", n.id, g.Why)
		// Its reports go in the registration's transaction.
		for _, id := range g.Report {
			n.atOnce[fmt.Sprintf("%s@%d", id, v.Nodes[id].Created)] = true
			w.m.Reports[supervise.ReportKey(id, n.id)] = supervise.Report{Suspect: id, Reporter: n.id, Inc: v.Nodes[id].Started.UnixNano()}
		}
		return nil
	}
	// Suspects: each registered process not heard for suspectAfter,
	// counted from no earlier than this process's registration and than
	// when its view first held that process's.
	suspects := map[string]int64{}
	for id, rec := range v.Nodes {
		if id == n.id {
			continue
		}
		b := w.index(id)
		key := fmt.Sprintf("%s@%d", id, rec.Created)
		if _, ok := n.seen[key]; !ok {
			n.seen[key] = w.tick
		}
		from := max(n.heard[b], n.regAt, n.seen[key])
		if n.atOnce[key] && n.heard[b] >= n.regAt {
			delete(n.atOnce, key)
		}
		after := w.k.SuspectAfter
		if x := w.nodes[b]; x.dead && rec.Started.UnixNano() == x.started {
			after = min(after, w.k.EndedAfter)
		}
		if w.tick-from >= after || n.atOnce[key] {
			suspects[id] = rec.Started.UnixNano()
		}
	}
	for key, r := range w.m.Reports {
		if inc, ok := suspects[r.Suspect]; r.Reporter == n.id && (!ok || inc != r.Inc) {
			delete(w.m.Reports, key)
		}
	}
	for id, inc := range suspects {
		key := supervise.ReportKey(id, n.id)
		if r, ok := w.m.Reports[key]; !ok || r.Inc != inc {
			w.m.Reports[key] = supervise.Report{Suspect: id, Reporter: n.id, Inc: inc}
			w.tracef("%s reports %s", n.id, id)
		}
	}
	for _, try := range n.f.Next(w.now(), supervise.NewFenceView(v), suspects) {
		n.f.Tried(w.now(), try.Node)
		if !w.guardHolds(v, try.Due) {
			continue
		}
		rec := w.m.Nodes[try.Node]
		delete(w.m.Nodes, try.Node)
		// The fenced process's reports are on its lease, which it revokes
		// once its record is gone (supervise's term end), or which
		// expires: a report it filed before is not counted after it
		// registers again and hears the suspect.
		for key, r := range w.m.Reports {
			if r.Reporter == try.Node {
				delete(w.m.Reports, key)
			}
		}
		w.rev++
		w.m.Fences[try.Node] = supervise.Fence{Node: try.Node, Inc: rec.Started.UnixNano(), By: n.id, Rev: w.rev}
		w.res.Fences++
		kind := "a majority's"
		if try.Cut {
			kind = "the cut's"
			w.res.CutFences++
			if 2*len(w.m.Nodes) <= len(w.nodes) {
				return fmt.Errorf("tick %d: %s fenced %s as the cut's pick, leaving %d of %d nodes registered", w.tick, n.id, try.Node, len(w.m.Nodes), len(w.nodes))
			}
		}
		w.tracef("%s fences %s (%s, reported by %v)", n.id, try.Node, kind, try.Reporters)
		f := w.nodes[w.index(try.Node)]
		if rec.Started.UnixNano() == f.started {
			// Twice was allowed while the model kept a fenced node's
			// reports, which the product revokes with its lease: a
			// report filed before the fence then counted once the node
			// was back and heard the suspect (seed 341, 4 nodes).
			f.fencedIn++
			if f.fencedIn > 1 {
				return fmt.Errorf("tick %d: %s fenced again with no fault begun or healed since", w.tick, try.Node)
			}
		}
		break
	}
	return nil
}

// guardHolds is supervise.FenceNode's transaction's condition: the
// suspect's record and each reporter's are the registrations read.
func (w *fencing) guardHolds(v *supervise.Membership, d supervise.Due) bool {
	for _, id := range append([]string{d.Node}, d.Reporters...) {
		read, ok := v.Nodes[id]
		now, ok2 := w.m.Nodes[id]
		if !ok || !ok2 || read.Created != now.Created {
			return false
		}
	}
	return true
}

// check holds the run to its promises at the end of a tick.
func (w *fencing) check(faults []*fenceFault, cut [][]bool) error {
	var cur *fenceFault
	for _, f := range faults {
		if f.start <= w.tick && w.tick < f.end {
			cur = f
		}
	}
	healed := 0
	for _, f := range faults {
		healed = max(healed, f.end)
	}
	switch {
	case cur != nil:
		// The bound is the design's for one fault on a whole cluster.
		// Faults on top of one another are held to safety and to the
		// heal alone: with two nodes fenced on one side of a cut, for
		// one, neither registers again on its own word, and the cut
		// stands until the heal (chaos counts such windows apart:
		// Window.Other).
		bad := w.unheard(cut)
		if bad == "" && w.resolvedAt == 0 {
			w.resolvedAt = w.tick
		}
		if !cur.alone || !cur.clean || w.tick-cur.start != w.k.Bound || !w.majorityCanHear(cut) {
			return nil
		}
		if bad != "" {
			return fmt.Errorf("tick %d: %d ticks into %s (a majority hears one another), the registered nodes still do not: %s", w.tick, w.k.Bound, cur.desc, bad)
		}
		w.res.Resolved++
		w.res.ResolveMax = max(w.res.ResolveMax, w.resolvedAt-cur.start)
	case w.tick == healed+w.k.HealBound:
		for _, n := range w.nodes {
			if !w.registered(n) {
				return fmt.Errorf("tick %d: %d ticks after the last heal, %s is not registered", w.tick, w.k.HealBound, n.id)
			}
		}
		if len(w.m.Reports) > 0 {
			return fmt.Errorf("tick %d: %d ticks after the last heal, reports stand: %v", w.tick, w.k.HealBound, slices.Sorted(maps.Keys(w.m.Reports)))
		}
	}
	return nil
}

// unheard names a pair of registered processes where one does not hear
// the other, or a registered process that does not run; "" if none.
func (w *fencing) unheard(cut [][]bool) string {
	var reg []int
	for i, n := range w.nodes {
		if rec, ok := w.m.Nodes[n.id]; ok {
			if rec.Started.UnixNano() != n.started || !up(n) {
				return fmt.Sprintf("%s's registered process does not run", n.id)
			}
			reg = append(reg, i)
		}
	}
	for _, a := range reg {
		for _, b := range reg {
			if a != b && cut[a][b] {
				return fmt.Sprintf("%s does not reach %s", w.nodes[a].id, w.nodes[b].id)
			}
		}
	}
	return ""
}

// majorityCanHear reports whether a majority of the nodes runs and hears
// one another, both ways, under cut.
func (w *fencing) majorityCanHear(cut [][]bool) bool {
	n := len(w.nodes)
	for set := 1; set < 1<<n; set++ {
		var in []int
		for i := range n {
			if set&(1<<i) != 0 {
				in = append(in, i)
			}
		}
		if 2*len(in) <= n {
			continue
		}
		ok := true
		for _, a := range in {
			ok = ok && up(w.nodes[a])
			for _, b := range in {
				ok = ok && (a == b || !cut[a][b])
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func cloneMembership(m *supervise.Membership) *supervise.Membership {
	return &supervise.Membership{Rev: m.Rev, Nodes: maps.Clone(m.Nodes), Replicas: m.Replicas,
		Reports: maps.Clone(m.Reports), Fences: maps.Clone(m.Fences)}
}
