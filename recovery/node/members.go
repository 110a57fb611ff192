package node

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// members is the node's view of the cluster: the live nodes and where
// each partition's replicas are and whether they are live. It follows
// etcd with a watch from a listed revision (supervise.Membership): one
// list at start, again after the watch is lost (a compaction, an error,
// etcd's member losing its leader) and for a settlement; between them
// only the changes cost anything. A list after every lost registration
// would add to the load that lost it: at 4096 partitions x 3 replicas it
// kept the nodes losing their registrations. The view is rebuilt from the records at most every
// membershipEvery, when they changed. Reads are cheap and lock-free for
// the reader of one view.
type members struct {
	n  *Node
	mu sync.Mutex
	v  *view
	// booted: once the cluster is bootstrapped it stays so.
	booted bool
	// recs are the records as of recs.Rev; nodesChanged and
	// placementChanged say what of them changed since v was built.
	recs                           *supervise.Membership
	nodesChanged, placementChanged bool
	// onPlacement, if set, is called from run with each view whose live
	// nodes or placement changed (the node's reconcile).
	onPlacement func(*view)
	// goneAt is when each node last left the view, until it is back;
	// first is when the first view was built (goneFor).
	goneAt map[string]time.Time
	first  time.Time
	// touchedAt is when a view first held each node's record as last
	// written (its ModRevision), by this node's clock: a registered
	// process updates it every supervise.ActivityEvery while it reaches
	// etcd (recordQuiet).
	touchedAt map[string]time.Time
}

type view struct {
	nodes     map[string]supervise.NodeRecord
	placement map[uint32][]replicaPlace
	// bootstrapped: every node of the placement has started once, so
	// client calls may be taken (supervise.Bootstrapped: every node of
	// the placement has started and registered once).
	bootstrapped bool
	// peers counts the views whose set of live nodes or placement
	// differed from the one before: what an attempt's peer check reads.
	// A node's activity update changes neither.
	peers uint64
	// rev is the etcd revision of the records the view was built from.
	rev int64
	// fences are the fences standing, by node; reported are the
	// processes this node reports, by node; fence is what the fence
	// loop reads (supervise.FenceView: the fences a majority backs,
	// docs/DESIGN.md "Fencing by the peers' word", and the cut's, "A cut
	// between two nodes").
	fences   map[string]supervise.Fence
	reported map[string]int64
	fence    supervise.FenceView
}

// holders lists the nodes holding a replica of p, in the placement's
// order.
func (v *view) holders(p uint32) []string {
	rps := v.placement[p]
	hs := make([]string, 0, len(rps))
	for _, rp := range rps {
		hs = append(hs, rp.node)
	}
	return hs
}

type replicaPlace struct {
	node string
	live bool
	// created is the record's creation revision: a record removed and
	// placed again (a move off the node, then one back onto it) is
	// another replica, though a view may never have seen the gap.
	created int64
	// rev is the record's last write (supervise.Replica.ModRevision).
	rev int64
	// held says why the replica is held (supervise.Replica.Held), and
	// lossAccepted that an admin accepted its loss
	// (supervise.Replica.LossAccepted): its node makes it live.
	held         string
	lossAccepted bool
}

func (m *members) view() *view {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.v
}

// viewRev is the revision of the current view, 0 before the first: what
// the node's record publishes as its ViewRev.
func (m *members) viewRev() int64 {
	if v := m.view(); v != nil {
		return v.rev
	}
	return 0
}

func (m *members) alive(node string) bool {
	_, ok := m.view().nodes[node]
	return ok
}

// aliveAs reports whether node is registered by its process of
// incarnation inc (a feed's Hello.Epoch).
func (m *members) aliveAs(node string, inc uint64) bool {
	rec, ok := m.view().nodes[node]
	return ok && uint64(incarnation(rec)) == inc
}

func (m *members) address(node string) (string, error) {
	rec, ok := m.view().nodes[node]
	if !ok {
		return "", fmt.Errorf("node %s is not alive", node)
	}
	return rec.Address, nil
}

// incarnation names one process of a node: the Started its records keep
// across the process's re-registrations. A feed is tied to it, not to one
// registration, so a node that re-registers after losing etcd keeps its
// feeds and misses no txn.
func incarnation(rec supervise.NodeRecord) int64 { return supervise.ProcessOf(rec) }

// listTimeout bounds one list of the membership: with etcd unreachable
// the view stays as last read (frozen) and the list is tried again. A
// list of 12,288 replica records took up to 2 s on a loaded machine.
const listTimeout = 10 * time.Second

// membershipEvery is the period of the view's rebuild (when the records
// changed) and of the check of the rejoin attempts' peers.
const membershipEvery = 100 * time.Millisecond

// refresh lists the membership and builds the view from it: the node's
// start, a lost watch, and a settlement (which needs the view of after its
// registration) call it. A list older than the records kept changes
// nothing.
func (m *members) refresh() error {
	ctx, cancel := context.WithTimeout(m.n.ctx, listTimeout)
	defer cancel()
	recs, err := supervise.ListMembership(ctx, m.n.cli)
	if err != nil {
		return err
	}
	m.mu.Lock()
	if m.recs == nil || recs.Rev >= m.recs.Rev {
		m.recs, m.nodesChanged, m.placementChanged = recs, true, true
	}
	m.mu.Unlock()
	return m.maybeRebuild(ctx)
}

// maybeRebuild builds a new view if the records changed since the last,
// or the cluster is not known bootstrapped yet. A change of node records
// that keeps the set of live nodes (a node's activity update) keeps the
// placement; any other change builds it again from the records.
func (m *members) maybeRebuild(ctx context.Context) error {
	m.mu.Lock()
	booted := m.booted
	m.mu.Unlock()
	if !booted {
		m.mu.Lock()
		placed := map[string]bool{}
		for _, r := range m.recs.Replicas {
			placed[r.Node] = true
		}
		m.mu.Unlock()
		nodes := make([]string, 0, len(placed))
		for node := range placed {
			nodes = append(nodes, node)
		}
		sort.Strings(nodes)
		b, err := supervise.Bootstrapped(ctx, m.n.cli, nodes)
		if err != nil {
			return err
		}
		var recs *supervise.Membership
		if b {
			// Listed after the bootstrap was read: every node that made
			// the cluster bootstrapped had registered by then
			// (supervise.MarkRegistered), so this view has it alive and
			// no write is taken without its replicas, which started live.
			if recs, err = supervise.ListMembership(ctx, m.n.cli); err != nil {
				return err
			}
		}
		m.mu.Lock()
		if b {
			if recs.Rev >= m.recs.Rev {
				m.recs, m.placementChanged = recs, true
			}
			m.booted, m.nodesChanged = true, true
		}
		m.mu.Unlock()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.nodesChanged && !m.placementChanged {
		return nil
	}
	old := m.v
	v := &view{nodes: make(map[string]supervise.NodeRecord, len(m.recs.Nodes)), bootstrapped: m.booted, rev: m.recs.Rev}
	for id, r := range m.recs.Nodes {
		if f := m.n.cfg.knobs.peerAddr; f != nil {
			r.Address = f(id, r.Address)
		}
		v.nodes[id] = r
	}
	sameNodes := old != nil && len(old.nodes) == len(v.nodes)
	if sameNodes {
		for id := range v.nodes {
			if _, ok := old.nodes[id]; !ok {
				sameNodes = false
				break
			}
		}
	}
	if sameNodes && !m.placementChanged {
		v.placement, v.peers = old.placement, old.peers
	} else {
		v.placement = placementOf(m.recs.Replicas, v.nodes)
		if old != nil {
			v.peers = old.peers + 1
		}
	}
	v.fences = maps.Clone(m.recs.Fences)
	v.reported = map[string]int64{}
	for _, r := range m.recs.Reports {
		if r.Reporter == m.n.id {
			v.reported[r.Suspect] = r.Inc
		}
	}
	v.fence = supervise.NewFenceView(m.recs)
	now := time.Now()
	m.noteTouchedLocked(old, v, now)
	m.noteGoneLocked(old, v, now)
	m.v, m.nodesChanged, m.placementChanged = v, false, false
	return nil
}

// noteTouchedLocked notes when each node's record, as v has it, was
// first seen; m.mu held.
func (m *members) noteTouchedLocked(old, v *view, now time.Time) {
	if m.touchedAt == nil {
		m.touchedAt = map[string]time.Time{}
	}
	var prev map[string]supervise.NodeRecord
	if old != nil {
		prev = old.nodes
	}
	for id, rec := range v.nodes {
		if o, ok := prev[id]; !ok || o.ModRevision != rec.ModRevision {
			m.touchedAt[id] = now
		}
	}
	for id := range m.touchedAt {
		if _, ok := v.nodes[id]; !ok {
			delete(m.touchedAt, id)
		}
	}
}

// quietFor reports how long node's record has stood unchanged in this
// node's views, and whether this node's own record changed in them
// within recordQuiet: a watch that brings nothing says nothing of the
// others. False for a node the view does not have.
func (m *members) quietFor(node, self string, now time.Time) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.touchedAt[node]
	mine, me := m.touchedAt[self]
	if !ok || !me || now.Sub(mine) >= recordQuiet {
		return 0, false
	}
	return now.Sub(at), true
}

// noteGoneLocked notes when the nodes alive in old and not in v left the
// view; m.mu held.
func (m *members) noteGoneLocked(old, v *view, now time.Time) {
	if m.goneAt == nil {
		m.goneAt, m.first = map[string]time.Time{}, now
	}
	for id := range v.nodes {
		delete(m.goneAt, id)
	}
	if old == nil {
		return
	}
	for id := range old.nodes {
		if _, ok := v.nodes[id]; !ok {
			if _, noted := m.goneAt[id]; !noted {
				m.goneAt[id] = now
			}
		}
	}
}

// goneFor reports how long node has been out of the view (since the first
// view, if it was never in one); gone is false while it is in.
func (m *members) goneFor(node string) (d time.Duration, gone bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.v != nil {
		if _, ok := m.v.nodes[node]; ok {
			return 0, false
		}
	}
	at, ok := m.goneAt[node]
	if !ok {
		at = m.first
	}
	if at.IsZero() {
		return 0, true
	}
	return time.Since(at), true
}

// placementOf is the placement of the replica records, each live if its
// record says so and its node is alive, each partition's in node order.
func placementOf(reps map[string]supervise.Replica, alive map[string]supervise.NodeRecord) map[uint32][]replicaPlace {
	keys := make([]string, 0, len(reps))
	for k := range reps {
		keys = append(keys, k)
	}
	sort.Strings(keys) // ReplicaKey order: partition, then node
	out := map[uint32][]replicaPlace{}
	for _, k := range keys {
		r := reps[k]
		_, ok := alive[r.Node]
		out[r.Partition] = append(out[r.Partition], replicaPlace{node: r.Node, live: ok && r.State == recovery.ReplicaLive, created: r.Created, rev: r.ModRevision, held: r.Held, lossAccepted: !r.LossAccepted.IsZero()})
	}
	return out
}

// follow keeps the records by the membership watch, listing them again
// when the watch ends or relist asks, until the node stops.
func (m *members) follow() {
	failing := false
	for m.n.ctx.Err() == nil {
		m.mu.Lock()
		rev := m.recs.Rev
		m.mu.Unlock()
		ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(m.n.ctx))
		err := m.watch(ctx, supervise.WatchMembership(ctx, m.n.cli, rev))
		cancel()
		if m.n.ctx.Err() != nil {
			return
		}
		m.n.log.Info("membership watch ended: listing the membership again", "rev", rev, "cause", err)
		for wait := membershipEvery; ; wait = min(2*wait, time.Second) {
			err := m.refresh()
			if err == nil {
				break
			}
			if m.n.ctx.Err() != nil {
				return
			}
			if !failing {
				m.n.log.Warn("reading cluster membership; the view stays as last read", "err", err)
				failing = true
			}
			select {
			case <-time.After(wait):
			case <-m.n.ctx.Done():
				return
			}
		}
		if failing {
			m.n.log.Info("cluster membership read again")
			failing = false
		}
	}
}

// watch applies the watch's events to the records until the watch ends,
// and returns why.
func (m *members) watch(ctx context.Context, wch clientv3.WatchChan) error {
	for {
		resp, ok := <-wch
		if !ok {
			return ctx.Err()
		}
		if err := resp.Err(); err != nil {
			return err
		}
		m.mu.Lock()
		var err error
		for _, ev := range resp.Events {
			var nodes, reps bool
			if nodes, reps, err = m.recs.Apply(ev); err != nil {
				break
			}
			m.nodesChanged = m.nodesChanged || nodes
			m.placementChanged = m.placementChanged || reps
		}
		m.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// partitionWatch lists the nodes whose failure ends a destination attempt
// of partition p on node self (the self-termination of DESIGN.md step 8):
// those whose replica of p is live in v when the attempt starts. The
// destination itself is not one, nor is a node whose replica is not live
// then (dead, or rejoining too): it failed before the attempt began, and
// counting it would end every attempt until it came back. A nil view (no
// membership read yet) watches nobody.
func partitionWatch(v *view, p uint32, self string) []string {
	if v == nil {
		return nil
	}
	var out []string
	for _, rp := range v.placement[p] {
		if _, alive := v.nodes[rp.node]; alive && rp.live && rp.node != self {
			out = append(out, rp.node)
		}
	}
	return out
}

// failedNode returns a watched node that has failed in v: its record is
// gone (its lease ended) or its replica of p is no longer live (it failed
// it, or the node restarted and set it to needs-rejoin).
func failedNode(v *view, p uint32, watch []string) (string, bool) {
	for _, node := range watch {
		if _, ok := v.nodes[node]; !ok {
			return node, true
		}
		live := false
		for _, rp := range v.placement[p] {
			if rp.node == node {
				live = rp.live
				break
			}
		}
		if !live {
			return node, true
		}
	}
	return "", false
}

// run follows the membership and, every membershipEvery, ends the
// rejoin attempts whose peer or, on the destination, any node of the
// partition failed (DESIGN.md step 8: the recovering side terminates its
// rejoin): on every replica when the view changed, else on those with an
// attempt under way (as their status says), so an idle node costs
// nothing per replica.
func (m *members) run() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.follow()
	}()
	defer func() { <-done }()
	t := time.NewTicker(membershipEvery)
	defer t.Stop()
	failing := false
	var checked *view // a view every replica was last checked against
	for tick := 0; ; tick++ {
		select {
		case <-m.n.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(m.n.ctx, listTimeout)
		err := m.maybeRebuild(ctx)
		cancel()
		if err != nil {
			if m.n.ctx.Err() == nil && !failing {
				m.n.log.Warn("reading whether the cluster is bootstrapped; the view stays as last read", "err", err)
			}
			failing = true
		} else if failing {
			m.n.log.Info("cluster bootstrap read again")
			failing = false
		}
		v := m.view()
		all := checked == nil || v.peers != checked.peers
		checked = v
		if all && m.onPlacement != nil {
			m.onPlacement(v)
		}
		waits := tick%waitCheckTicks == 0
		now := time.Now().UnixNano()
		for _, r := range m.n.hosted() {
			if all || attemptOpen(r.status.Load()) {
				r.do(func(r *replica) { r.checkPeers(v) })
			}
			if s := r.waitingSince.Load(); waits && s != 0 && now-s >= int64(waitLogAfter) {
				select {
				case r.in <- func(r *replica) { r.logWait() }:
				default: // a full inbox: the replica is busy, not stalled
				}
			}
		}
	}
}

// waitLogAfter is how long a replica holds txns it cannot run before the
// node logs what it waits for (replica.logWait), every waitCheckTicks
// membership periods at most: a partition that stalls says which
// initiator, or which gate, holds it.
const (
	waitLogAfter   = time.Second
	waitCheckTicks = 5
)

// attemptOpen reports whether a replica's status shows a rejoin attempt
// under way on it, as destination or source, or no status yet. The
// status is published every tick, so an attempt that began since is
// checked at the next period.
func attemptOpen(st *ReplicaStatus) bool {
	if st == nil || st.Rejoin != nil && st.Rejoin.Ended.IsZero() {
		return true
	}
	for _, s := range st.Sources {
		if s.Ended.IsZero() {
			return true
		}
	}
	return false
}
