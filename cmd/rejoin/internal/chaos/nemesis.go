package chaos

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/node"
)

// nodeState is what the nemesis did to a node.
type nodeState int

const (
	nodeUp       nodeState = iota
	nodeDown               // killed by us (or exited, noted), not restarted yet
	nodeStarting           // being restarted
	nodePaused             // SIGSTOPped by us
)

// viewTimeout bounds the nemesis's reading of the cluster before a fault;
// a rejoin fault looks for a rejoin in progress every rejoinPollEvery for
// up to rejoinWaitMax.
const (
	viewTimeout     = 3 * time.Second
	rejoinWaitMax   = 5 * time.Second
	rejoinPollEvery = 50 * time.Millisecond
)

// faultWindow is a fault's span; end is zero while it lasts.
type faultWindow struct {
	action     Action
	start, end time.Time
	hit        []uint32
	nodes      []int
	other      []int // Window.Other
}

// openWindowLocked records that a fault of action starts now, hitting
// partitions hit and faulting nodes; it returns its index. ns.mu held.
func (ns *nemesis) openWindowLocked(action Action, hit []uint32, nodes []int) int {
	ns.windows = append(ns.windows, faultWindow{action: action, start: time.Now(), hit: hit, nodes: nodes})
	return len(ns.windows) - 1
}

// closeWindowLocked records that fault i ended now. ns.mu held.
func (ns *nemesis) closeWindowLocked(i int) {
	if i >= 0 && i < len(ns.windows) && ns.windows[i].end.IsZero() {
		ns.windows[i].end = time.Now()
	}
}

// Windows are the faults' spans from t0, those still open ending at
// end.
func (ns *nemesis) Windows(t0, end time.Time) []Window {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	out := make([]Window, len(ns.windows))
	for i, w := range ns.windows {
		e := w.end
		if e.IsZero() {
			e = end
		}
		out[i] = Window{Action: w.action, Start: w.start.Sub(t0), End: e.Sub(t0), Hit: w.hit, Nodes: w.nodes, Other: w.other}
	}
	return out
}

// replicasOf maps each partition of v to the ids of its replicas' nodes.
func replicasOf(v clusterview.View) map[uint32][]int {
	out := map[uint32][]int{}
	for _, rp := range v.Replicas {
		var id int
		if _, err := fmt.Sscanf(rp.Node, "n%d", &id); err == nil {
			out[rp.Partition] = append(out[rp.Partition], id)
		}
	}
	return out
}

// hitBy lists the partitions with a replica on one of nodes (a process
// fault) or whose replicas cut c separates, or cuts from etcd.
func hitBy(v clusterview.View, nodes []int, c Cut) []uint32 {
	var out []uint32
	for p, ids := range replicasOf(v) {
		in := func(set []int) bool {
			return slices.ContainsFunc(ids, func(id int) bool { return slices.Contains(set, id) })
		}
		if in(nodes) || in(c.Etcd) || (in(c.A) && in(c.B)) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// nemesis runs a schedule against the cluster: it tracks what it did to
// each node and never faults the last live replica of a partition.
type nemesis struct {
	// ctx bounds the restarts: the whole run's, not the schedule's.
	ctx    context.Context
	nodes  procs
	etcd   *demo.Etcd
	cli    *clientv3.Client
	hc     *http.Client
	n      int
	logf   func(format string, args ...any)
	exitsf func(id int, err error) // a node exited on its own

	// net applies the network faults; nil: none are run.
	net *netFaults

	mu         sync.Mutex
	state      []nodeState // by node id (index 0 unused)
	etcdPaused bool
	// netOn: a network fault is in place; cutOff are the nodes it left
	// on the short side (Step.CutOff), whose replicas count as no live
	// copy for another fault.
	netOn  bool
	cutOff map[string]bool
	// windows are the faults' spans (for Availability); killWin is the
	// open window of each node killed, by node id.
	windows   []faultWindow
	killWin   map[int]int
	healc     chan struct{} // closed: end every fault now
	abandoned bool          // the run ended early: heal nothing
	wg        sync.WaitGroup
	done      int
	skipped   int
}

func newNemesis(ctx context.Context, nodes *demo.Nodes, etcd *demo.Etcd, cli *clientv3.Client, n int, logf func(string, ...any), exitsf func(int, error)) *nemesis {
	return &nemesis{ctx: ctx, nodes: nodes, etcd: etcd, cli: cli, hc: &http.Client{Timeout: viewTimeout}, n: n, logf: logf, exitsf: exitsf,
		state: make([]nodeState, n+1), healc: make(chan struct{}), cutOff: map[string]bool{}, killWin: map[int]int{}}
}

// run plays the schedule from now until ctx ends or the steps run out.
func (ns *nemesis) run(ctx context.Context, steps []Step) {
	start := time.Now()
	for _, s := range steps {
		if !sleepCtx(ctx, time.Until(start.Add(s.At))) {
			return
		}
		ns.noteExits()
		if why := ns.do(ctx, s); why != "" {
			ns.mu.Lock()
			ns.skipped++
			ns.mu.Unlock()
			ns.logf("nemesis: skip %s: %s", s, why)
		}
	}
}

// do runs one step; it returns why it did not, "" if it did.
func (ns *nemesis) do(ctx context.Context, s Step) string {
	switch s.Action {
	case ActPauseEtcd:
		ns.mu.Lock()
		if ns.etcdPaused {
			ns.mu.Unlock()
			return "etcd is paused already"
		}
		if err := ns.etcd.Pause(); err != nil {
			ns.mu.Unlock()
			return err.Error()
		}
		ns.etcdPaused = true
		ns.done++
		win := ns.openWindowLocked(s.Action, nil, nil)
		ns.mu.Unlock()
		ns.logf("nemesis: paused etcd (SIGSTOP, pid %d) for %.2fs", ns.etcd.Pid(), s.For.Seconds())
		ns.after(s.For, func() {
			ns.mu.Lock()
			defer ns.mu.Unlock()
			if err := ns.etcd.Resume(); err != nil {
				ns.logf("nemesis: resume etcd: %v", err)
				return
			}
			ns.etcdPaused = false
			ns.closeWindowLocked(win)
			ns.logf("nemesis: resumed etcd (SIGCONT)")
		})
		return ""
	}
	if s.Action.IsNet() {
		return ns.doNet(ctx, s)
	}

	v, err := ns.view(ctx)
	if err != nil {
		return "cannot read the cluster: " + err.Error()
	}
	target, what := s.Node, ""
	switch s.Action {
	case ActKillSource, ActKillDestination:
		// A rejoin of a small partition lasts a fraction of a second:
		// look for one for a while.
		rs := rejoinsOf(v)
		for deadline := time.Now().Add(rejoinWaitMax); len(rs) == 0 && time.Now().Before(deadline); rs = rejoinsOf(v) {
			if !sleepCtx(ctx, rejoinPollEvery) {
				return "the schedule ended"
			}
			if v, err = ns.view(ctx); err != nil {
				return "cannot read the cluster: " + err.Error()
			}
		}
		if len(rs) == 0 {
			return fmt.Sprintf("no rejoin in progress within %s", rejoinWaitMax)
		}
		r := rs[s.Pick%len(rs)]
		peer := r.dest
		if s.Action == ActKillSource {
			peer = r.source
		}
		if _, err := fmt.Sscanf(peer, "n%d", &target); err != nil || target < 1 || target > ns.n {
			return fmt.Sprintf("rejoin peer %q is not one of ours", peer)
		}
		what = fmt.Sprintf(" (%s of partition %d's rejoin %s -> %s)", map[bool]string{true: "source", false: "destination"}[s.Action == ActKillSource], r.partition, r.source, r.dest)
	}

	ns.mu.Lock()
	defer ns.mu.Unlock()
	if st := ns.state[target]; st != nodeUp {
		return fmt.Sprintf("n%d is not up", target)
	}
	if p, ok := ns.lastLiveLocked(v, node.NodeName(target)); !ok {
		return fmt.Sprintf("n%d holds the last live replica of partition %d", target, p)
	}
	switch s.Action {
	case ActKill, ActKillSource, ActKillDestination:
		if err := ns.nodes.Kill(target); err != nil {
			return err.Error()
		}
		ns.state[target] = nodeDown
		ns.done++
		ns.killWin[target] = ns.openWindowLocked(s.Action, hitBy(v, []int{target}, Cut{}), []int{target})
		ns.logf("nemesis: killed n%d%s (SIGKILL); restart after %.2fs", target, what, s.For.Seconds())
		ns.after(s.For, func() { ns.restart(ns.ctx, target) })
	case ActStop:
		if err := ns.nodes.Pause(target); err != nil {
			return err.Error()
		}
		ns.state[target] = nodePaused
		ns.done++
		win := ns.openWindowLocked(s.Action, hitBy(v, []int{target}, Cut{}), []int{target})
		ns.logf("nemesis: stopped n%d (SIGSTOP) for %.2fs", target, s.For.Seconds())
		ns.after(s.For, func() {
			ns.mu.Lock()
			defer ns.mu.Unlock()
			ns.closeWindowLocked(win)
			if ns.state[target] != nodePaused {
				return
			}
			if err := ns.nodes.Resume(target); err != nil {
				ns.logf("nemesis: resume n%d: %v", target, err)
			}
			ns.state[target] = nodeUp
			ns.logf("nemesis: resumed n%d (SIGCONT)", target)
		})
	default:
		return fmt.Sprintf("unknown action %q", s.Action)
	}
	return ""
}

// doNet runs network step s: it returns why it did not, "" if it did.
func (ns *nemesis) doNet(ctx context.Context, s Step) string {
	if ns.net == nil {
		return "network faults are off"
	}
	v, err := ns.view(ctx)
	if err != nil {
		return "cannot read the cluster: " + err.Error()
	}
	what := s.NetString(ns.n)
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.netOn {
		return "a network fault is in place already"
	}
	off := map[string]bool{}
	for _, id := range s.CutOff(ns.n) {
		off[node.NodeName(id)] = true
	}
	if p, ok := ns.lastLiveSetLocked(v, off); !ok {
		return fmt.Sprintf("the nodes it cuts off %v hold the last live replica of partition %d", s.CutOff(ns.n), p)
	}
	if err := ns.net.apply(ctx, s); err != nil {
		return err.Error()
	}
	ns.netOn, ns.cutOff = true, off
	ns.done++
	win := ns.openWindowLocked(s.Action, hitBy(v, nil, s.Cut(ns.n)), s.CutOff(ns.n))
	ns.windows[win].other = s.BridgeOther(ns.n)
	ns.logf("net fault: %s for %.2fs", what, s.For.Seconds())
	ns.after(s.For, func() {
		ns.mu.Lock()
		defer ns.mu.Unlock()
		if err := ns.net.heal(); err != nil {
			ns.logf("net fault: heal %s: %v", what, err)
			return
		}
		ns.netOn, ns.cutOff = false, map[string]bool{}
		ns.closeWindowLocked(win)
		ns.logf("net fault healed: %s", what)
	})
	return ""
}

// lastLiveLocked reports whether target holds the last live replica of
// some partition: a replica is live when its node is up (as far as the
// nemesis knows), etcd has it live and its node reports it live, and no
// network fault cut its node off. A target whose replica of a partition
// is not live takes nothing from it (even from a partition left with no
// live replica at all). ns.mu held.
func (ns *nemesis) lastLiveLocked(v clusterview.View, target string) (uint32, bool) {
	return ns.lastLiveSetLocked(v, map[string]bool{target: true})
}

// lastLiveSetLocked is lastLiveLocked for a fault of several nodes at
// once: whether they hold between them the last live replica of a
// partition. ns.mu held.
func (ns *nemesis) lastLiveSetLocked(v clusterview.View, targets map[string]bool) (uint32, bool) {
	hosted := map[uint32]bool{}
	others := map[uint32]int{}
	for _, rp := range v.Replicas {
		var id int
		if _, err := fmt.Sscanf(rp.Node, "n%d", &id); err != nil || id < 1 || id > ns.n || ns.state[id] != nodeUp {
			continue
		}
		live := rp.Placement == recovery.ReplicaLive && rp.Alive && rp.Reported && rp.State == recovery.ReplicaLive
		switch {
		case targets[rp.Node]:
			// Settling or not, it may hold the partition's only copy;
			// and so it may when etcd has lost its registration (an etcd
			// pause) or it did not answer: what it holds is unknown, and
			// a kill loses it.
			if live || !rp.Alive || !rp.Reported {
				hosted[rp.Partition] = true
			}
		case !live, ns.cutOff[rp.Node]:
		case !rp.Settling:
			// A replica whose node is settling a lost registration may
			// yet fail for what it missed: not one to leave a partition
			// with.
			others[rp.Partition]++
		}
	}
	ps := make([]uint32, 0, len(hosted))
	for p := range hosted {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	for _, p := range ps {
		if others[p] == 0 {
			return p, false
		}
	}
	return 0, true
}

// after runs f once d passed, or at once when the nemesis heals.
func (ns *nemesis) after(d time.Duration, f func()) {
	ns.wg.Go(func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ns.healc:
		}
		ns.mu.Lock()
		abandoned := ns.abandoned
		ns.mu.Unlock()
		if !abandoned {
			f()
		}
	})
}

// abandon ends the pending ends of faults without running them: the run
// was interrupted, and stops every process (and its chain) itself.
func (ns *nemesis) abandon() {
	ns.mu.Lock()
	ns.abandoned = true
	ns.mu.Unlock()
	close(ns.healc)
	ns.wg.Wait()
}

// procs are the node processes the nemesis starts, kills, pauses and
// resumes (demo.Nodes).
type procs interface {
	Start(ctx context.Context, id int) (demo.ReadyLine, int, error)
	Kill(id int) error
	Pause(id int) error
	Resume(id int) error
	Exited(id int) (bool, error)
}

// restartRetry is the pause before a failed restart is tried again.
const restartRetry = time.Second

// restart starts node id again, if the nemesis had it down. A start that
// fails (a node exits when it cannot reach etcd as it starts: a network
// fault between them still in place) is tried again every restartRetry,
// as a service manager restarts a unit that failed, until the heal,
// which tries on its own. Tried once only, a node whose restart fell in
// an etcd cut stayed down for the 8.5 minutes left of the run, and the
// faults meant for it were skipped (rejoin chaos --duration 10m --seed
// 20261128).
func (ns *nemesis) restart(ctx context.Context, id int) {
	ns.mu.Lock()
	if ns.state[id] != nodeDown {
		ns.mu.Unlock()
		return
	}
	ns.state[id] = nodeStarting
	ns.mu.Unlock()
	ready, pid, err := ns.nodes.Start(ctx, id)
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if err != nil {
		// Not ready in time (e.g. etcd paused past its --etcd-timeout):
		// down again; the heal tries once more.
		ns.state[id] = nodeDown
		select {
		case <-ns.healc:
			ns.logf("nemesis: restart n%d failed: %v", id, err)
		default:
			ns.logf("nemesis: restart n%d failed: %v; trying again in %v", id, err, restartRetry)
			ns.after(restartRetry, func() { ns.restart(ctx, id) })
		}
		return
	}
	ns.state[id] = nodeUp
	if w, ok := ns.killWin[id]; ok {
		ns.closeWindowLocked(w)
		delete(ns.killWin, id)
	}
	ns.logf("nemesis: restarted n%d (pid %d, tcp %s)", id, pid, ready.TCP)
}

// noteExits finds the nodes up or paused whose process exited: not our
// doing. Each is reported and counted down, so the heal restarts it.
func (ns *nemesis) noteExits() {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	for id := 1; id <= ns.n; id++ {
		if st := ns.state[id]; st != nodeUp && st != nodePaused {
			continue
		}
		if exited, err := ns.nodes.Exited(id); exited {
			ns.state[id] = nodeDown
			ns.exitsf(id, err)
		}
	}
}

// heal ends every fault: etcd and the paused nodes resume, the nodes down
// restart (each is tried up to three times).
func (ns *nemesis) heal() error {
	close(ns.healc)
	ns.wg.Wait()
	ns.noteExits()
	ns.mu.Lock()
	if ns.etcdPaused {
		_ = ns.etcd.Resume()
		ns.etcdPaused = false
	}
	ns.mu.Unlock()
	for id := 1; id <= ns.n; id++ {
		for attempt := 0; attempt < 3; attempt++ {
			ns.mu.Lock()
			st := ns.state[id]
			ns.mu.Unlock()
			if st != nodeDown {
				break
			}
			ns.restart(ns.ctx, id)
		}
		ns.mu.Lock()
		st := ns.state[id]
		ns.mu.Unlock()
		if st != nodeUp {
			return fmt.Errorf("n%d could not be restarted (see its log)", id)
		}
	}
	return nil
}

// watchExits polls for nodes that exited on their own until ctx ends.
func (ns *nemesis) watchExits(ctx context.Context) {
	for sleepCtx(ctx, 500*time.Millisecond) {
		ns.noteExits()
	}
}

func (ns *nemesis) view(ctx context.Context) (clusterview.View, error) {
	ctx, cancel := context.WithTimeout(ctx, viewTimeout)
	defer cancel()
	return clusterview.Read(ctx, ns.cli, ns.hc, time.Second)
}

// rejoin is a rejoin stream in progress, as its source reports it.
type rejoin struct {
	partition    uint32
	source, dest string
}

// rejoinsOf lists the rejoins in progress in v, in a stable order.
func rejoinsOf(v clusterview.View) []rejoin {
	var out []rejoin
	for id, st := range v.Status {
		for _, rs := range st.Replicas {
			for _, s := range rs.Sources {
				if s.Ended.IsZero() {
					out = append(out, rejoin{rs.Partition, id, s.Peer})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b rejoin) int {
		if a.partition != b.partition {
			return int(a.partition) - int(b.partition)
		}
		if c := clusterview.CmpNodeID(a.source, b.source); c != 0 {
			return c
		}
		return clusterview.CmpNodeID(a.dest, b.dest)
	})
	return out
}
