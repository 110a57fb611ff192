package node

import (
	"errors"
	"maps"
	"sort"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/nodestate"
)

// The node's replicas follow the placement while it runs (docs/DESIGN.md
// "Membership moves"): a replica record a move adds for this node makes
// it create the replica, needs-rejoin, rebuilt by a normal rejoin; a
// record a move removed makes it drop the replica. The start reads the
// placement as before (hostReplicas); reconcile keeps it from then on.

// hosted returns the replicas the node hosts, by partition. The map is
// never written once published: read it freely, never write it.
func (n *Node) hosted() map[uint32]*replica {
	if m := n.replicas.Load(); m != nil {
		return *m
	}
	return nil
}

// reconcile creates the replicas that view v places on this node and it
// does not host, and drops those it hosts that v places elsewhere. The
// members loop calls it when the placement changed. Before the cluster is
// bootstrapped the placement is what the start read, and nothing moves.
//
// A replica whose record was removed and placed again (a move took it off
// this node and the next one put it back) is replaced: dropped, and
// created anew, needs-rejoin. The view is rebuilt from the records at
// most every membershipEvery, so it may never show the gap between the
// remove and the new record; judged by presence alone, the old replica,
// live, stayed, and the new record waited forever for a rejoin it never
// opened (issue 28: a rebalance right after an interrupted drain). The
// old one is not the new one's content either: the initiators that saw
// the gap sent the partition's txns elsewhere meanwhile.
func (n *Node) reconcile(v *view) {
	if v == nil || !v.bootstrapped {
		return
	}
	cur := n.hosted()
	want := map[uint32]int64{} // the record's creation revision, by partition
	for p, rps := range v.placement {
		for _, rp := range rps {
			if rp.node == n.id {
				want[p] = rp.created
				if r := cur[p]; rp.lossAccepted && r != nil && r.created == rp.created {
					rev := rp.rev
					r.do(func(r *replica) { r.acceptLoss(rev) })
				}
			}
		}
	}
	var add, drop []uint32
	for p, created := range want {
		switch r := cur[p]; {
		case r == nil:
			add = append(add, p)
		case r.created != 0 && created != 0 && r.created != created:
			n.log.Info("replica placed here again since it moved off: replaced", "partition", p,
				"record_was", r.created, "record_now", created)
			add, drop = append(add, p), append(drop, p)
		}
	}
	for p := range cur {
		if _, ok := want[p]; !ok {
			drop = append(drop, p)
		}
	}
	if len(add) == 0 && len(drop) == 0 {
		return
	}
	sort.Slice(add, func(i, j int) bool { return add[i] < add[j] })
	sort.Slice(drop, func(i, j int) bool { return drop[i] < drop[j] })
	next := maps.Clone(cur)
	if next == nil {
		next = map[uint32]*replica{}
	}
	var dropped []*replica
	for _, p := range drop {
		dropped = append(dropped, next[p])
		delete(next, p)
	}
	var added []*replica
	for _, p := range add {
		// Needs-rejoin, as a restarted node's replica: the move wrote
		// its record so, and it holds nothing yet.
		if err := n.store.SetReplica(nodestate.Replica{Partition: p, State: recovery.ReplicaNeedsRejoin}); err != nil {
			n.log.Error("record a replica moved here", "partition", p, "err", err)
			continue
		}
		r, err := newReplica(n, p, false)
		if err != nil {
			n.log.Error("create a replica moved here", "partition", p, "err", err)
			continue
		}
		r.placedAt, r.created = v.rev, want[p]
		next[p] = r
		added = append(added, r)
	}
	// Published before the open feeds are read: a feed that opens
	// meanwhile either is read below or finds the new replica in the map
	// (serveFeed adds its initiator to every hosted replica after it is
	// in feeds.by), so every replica tracks every feed's initiator.
	n.replicas.Store(&next)
	// The old replicas go before the new ones run: a replaced one's drop
	// clears its partition's opened task and unpublished mark, which must
	// not be the new one's.
	for _, r := range dropped {
		n.dropReplica(r)
	}
	for _, r := range added {
		n.trackFeeds(r)
		n.goRun(r.loop)
		n.log.Info("replica moved here: it rejoins", "partition", r.p, "view_rev", r.placedAt)
	}
}

// trackFeeds makes a replica created while the node runs track the
// initiator of every feed open here that joined its partition, as the
// join did for the replicas it found: a destination attempt on it then
// buffers their txns.
func (n *Node) trackFeeds(r *replica) {
	n.feeds.mu.Lock()
	var fs []*feedIn
	for _, fi := range n.feeds.by {
		fs = append(fs, fi)
	}
	n.feeds.mu.Unlock()
	for _, fi := range fs {
		if fi.hasJoined(r.p) {
			r.do(func(r *replica) { r.addInitiator(fi.in, fi.inc, fi.beat) })
		}
	}
}

// dropReplica ends a replica the placement no longer gives this node:
// its attempts end (a rejoin it serves or takes aborts), its loop ends,
// and with the map no longer holding it, its content is freed.
func (n *Node) dropReplica(r *replica) {
	n.openMu.Lock()
	delete(n.opened, r.p)
	n.openMu.Unlock()
	n.unpublished(r.p, false)
	if err := n.store.SetReplica(nodestate.Replica{Partition: r.p, State: recovery.ReplicaNeedsRejoin}); err != nil {
		n.log.Error("record a replica moved off", "partition", r.p, "err", err)
	}
	r.do(func(r *replica) {
		r.core.Stop("the replica moved off this node")
		r.drain()
		r.dropped = true
	})
	n.log.Info("replica moved off this node: dropped", "partition", r.p)
}

// placedSeen reports whether every running node's initiator sequences
// with a view that holds r (its record's ViewRev is at or past the
// revision r was placed at): only then may r's rejoin start, so that no
// txn of its partition goes to the source alone once r buffers the feed.
// A replica placed here by a move waits for the views to catch up, while
// the node runs or when it restarted during the move; one placed long
// before is seen by every view that exists. The node's own view is read
// directly: its record's ViewRev lags it by up to an activity update.
func (n *Node) placedSeen(r *replica) bool {
	if r.placedAt == 0 {
		return true
	}
	v := n.members.view()
	if v == nil || v.rev < r.placedAt {
		return false
	}
	for id, rec := range v.nodes {
		if id != n.id && rec.ViewRev < r.placedAt {
			return false
		}
	}
	return true
}

// errViewBehind: the node's view is older than its registration.
var errViewBehind = errors.New("node: the membership view is older than the node's registration; no call is sequenced until it catches up")

// viewBehindTerm reports whether view v is older than the node's current
// registration (its record's creation). A node that comes back from a
// lapsed registration was counted by no move's wait (placedSeen) while
// it was away, and its view, frozen then, may lack a replica a move
// placed meanwhile: its initiator would send that partition's txns to the
// old holders alone. So it sequences nothing until its view is at least
// as new as its registration, which is after any such replica appeared.
func (n *Node) viewBehindTerm(v *view) bool {
	t := n.reg.Term()
	return t != nil && v != nil && v.rev < t.Created
}
