package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/txnid"
)

// The node without the coordinator (docs/DESIGN.md "Without the
// coordinator"): a lost registration ends only the work that needs one.
// The replicas, their feeds and their execution go on, with the view
// frozen at its last read; the rejoin work (claims, task opening,
// supervision) stops, and the initiator sequences no new call. When the
// node registers again, its replicas stay live if they provably missed
// nothing, and are failed (needs-rejoin) otherwise.

// outage is what the node keeps of its registration's losses until a
// later term settles them.
type outage struct {
	// feeds are the feeds in from each initiator when the earliest
	// unsettled loss began.
	feeds map[txnid.Initiator]*feedIn
	// lapses and rev are Term.Lapses and Term.Revision of the term that
	// was lost then: the node was registered at revision rev.
	lapses int
	rev    int64
	// tellsFrom is feedIns.tells then: the hellos numbered above it came
	// in this outage or after it.
	tellsFrom uint64
	// view is the membership view then: the placement the outage began
	// with, and what each node's view had caught up to (holders).
	view *view
}

// registration runs the work that needs the node's registration, one
// term of it at a time, until the node stops.
func (n *Node) registration() {
	t := n.reg.Term()
	var out *outage
	for {
		ctx, cancel := context.WithCancel(n.ctx)
		stop := context.AfterFunc(t.Context(), cancel)
		if out != nil && n.settle(ctx, out, t) {
			out = nil
		}
		if out == nil {
			n.settledTerm.Store(int64(t.Seq))
		}
		var wg sync.WaitGroup
		for _, f := range []func(context.Context){n.republishLoop, n.openTasks, n.supervise} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f(ctx)
			}()
		}
		<-ctx.Done()
		if n.ctx.Err() == nil {
			n.termLost.Store(time.Now().UnixNano())
		}
		if out != nil {
			// Lost again before the last loss was settled: what its
			// settlement let out (freeSettled) may miss txns again.
			n.feeds.unsettle()
		}
		if out == nil && n.ctx.Err() == nil {
			// At once: a feed that breaks and opens again from here on
			// must not count as open throughout; and a replica that may
			// miss txns from the lease's end on answers nothing until
			// settled.
			feeds, tells := n.feedsNow()
			out = &outage{feeds: feeds, lapses: t.Lapses, rev: t.Revision(), tellsFrom: tells, view: n.members.view()}
			n.feeds.holdFrom(holdStart(t, time.Now()))
		}
		wg.Wait()
		stop()
		cancel()
		if n.ctx.Err() != nil {
			return
		}
		n.log.Warn("registration lost: replicas, feeds and execution go on; rejoin work, task opening, supervision and new calls stop until etcd answers",
			"term", t.Seq, "cause", t.Err())
		next, err := n.reg.NextTerm(n.ctx, t)
		if err != nil {
			return
		}
		t = next
	}
}

// leaseMargin is how long before its lease's earliest end (
// supervise.Term.LeaseSafeUntil) a node cut from etcd begins to hold its
// replicas' results: for the rates of this machine's clock and etcd's,
// and for a result read before the hold began and sent after.
const leaseMargin = 250 * time.Millisecond

// holdStart is when the node whose term t ended at now holds its
// replicas' results (docs/DESIGN.md "No answer from an unsettled
// replica"). A term ended by etcd itself (the record removed, the lease
// gone, another process registered) holds at once: others may have
// taken the node for dead already. One ended because etcd could not be
// reached holds from a margin before the lease may end: until then its
// record stands unless its peers fence it, every initiator goes on
// waiting for its replicas, and a process that registers meanwhile sees
// it alive and feeds it, so its replicas miss nothing the feeds' own
// rules do not cover. A fence (the record deleted while the lease
// stands) needs the node's peers to have lost its feeds, so it was cut
// from them too: those that fenced it stop waiting for it and run on
// without its tail, and an initiator that still counts it also waits for
// the replicas that did, whose answers, if they differ, make the call's
// outcome unknown. The hold from the term's end covered no more of that:
// the fence comes before it (1.7 s against 2.6 s). Held from the term's
// end, the results of a node cut from etcd
// for 2.6 s held the writes of the partitions it holds, once a node
// killed 0.14 s before it was fenced, until its lease ended and the
// others dropped it: 4.35 s without a successful op (rejoin chaos
// --net-faults on --seed 20261128, 10m, +178.58 s).
func holdStart(t *supervise.Term, now time.Time) time.Time {
	safe := t.LeaseSafeUntil()
	if !errors.Is(t.Err(), supervise.ErrUnreachable) || safe.IsZero() {
		return now
	}
	return later(now, safe.Add(-leaseMargin))
}

// settle settles, once the node is registered again, what its replicas
// may have missed while it was not: recovery.Settle decides, by the rules
// of docs/DESIGN.md "Without the coordinator" ("Settling a lapse"); this
// side reads what it decides from (the membership read after registering
// again, and every node that registered between the last revision this
// node was registered at and its new record, read from etcd's history),
// waits for the feeds it asks for (missedWait each), and fails the
// replicas it names. False: the term ended before the check could be
// made; the next term makes it.
func (n *Node) settle(ctx context.Context, out *outage, t *supervise.Term) bool {
	// First the replicas that failed while etcd could not be told: etcd
	// still has them live, and every call of their partitions waits for
	// results they will never send, until their state is published. That
	// was after the settlement, which may wait seconds for a node cut off:
	// n1, back from 20 s cut from etcd, held three partitions that no
	// fault touched 1.04 s without a successful op (rejoin chaos
	// --net-faults on --seed 20261128, 10m, +81.85 s).
	n.republish(ctx, true)
	in := &recovery.SettleInput{Lapsed: t.Lapses != out.lapses, Expired: map[string]bool{}}
	hosted := n.hosted()
	if in.Lapsed {
		for {
			err := n.members.refresh()
			var meanwhile []supervise.NodeRecord
			in.Meanwhile, in.Compacted, in.Others = nil, false, nil
			if err == nil {
				hctx, cancel := context.WithTimeout(ctx, historyTimeout)
				meanwhile, err = supervise.RegisteredBetween(hctx, n.cli, out.rev, t.Created)
				cancel()
				if errors.Is(err, rpctypes.ErrCompacted) {
					in.Compacted, err = true, nil
				}
			}
			if err == nil {
				var last supervise.LastLive
				in.Holders, last, err = n.holders(ctx, out, t.Created, hosted)
				if err == nil && in.Holders == nil {
					n.log.Info("registration lapsed: its holders unknown (history compacted or no view then), every partition settles with every gap")
				}
				// The replicas live for some view of the outage, and of
				// each process registered meanwhile, from its
				// registration on (its views are no older).
				if in.Holders != nil {
					in.Others = n.othersLive(last, 0, hosted)
				}
				for _, rec := range meanwhile {
					m := recovery.SettleProcess{Node: rec.ID, Inc: uint64(incarnation(rec))}
					if in.Holders != nil {
						m.Others = n.othersLive(last, rec.Created, hosted)
					}
					in.Meanwhile = append(in.Meanwhile, m)
				}
			}
			if err == nil {
				break
			}
			n.log.Info("reading the membership after a lapse", "err", err)
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return false
			}
		}
	}
	for p := range hosted {
		in.Partitions = append(in.Partitions, p)
	}
	conns := map[*feedIn]uint64{}
	in.Before = settleFeeds(out.feeds, conns)
	waits := map[string]time.Time{} // when each wait for a node's feed began
	failed := map[uint32]bool{}     // the replicas freeSettled failed
	var o recovery.SettleOutcome
	for {
		n.settleRead(in, conns, out.tellsFrom)
		o = recovery.Settle(in)
		if in.Lapsed {
			n.freeSettled(o, hosted, failed)
		}
		if o.Verdict != recovery.SettleWait {
			break
		}
		if waits[o.WaitFor].IsZero() {
			waits[o.WaitFor] = time.Now()
		}
		if time.Since(waits[o.WaitFor]) >= missedWait {
			in.Expired[o.WaitFor] = true
			continue
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return false
		}
	}
	switch {
	case !in.Lapsed:
		n.log.Info("registration resumed on its lease: no node took this one for dead, its replicas missed nothing")
	case o.Verdict == recovery.SettleKeep && len(o.Gaps) == 0:
		n.log.Info("registration lapsed; the feed of every live node stayed open throughout: replicas stay live")
	}
	if in.Lapsed && !n.settleFeedsOut(ctx, o, hosted, failed) {
		return false
	}
	for p, why := range o.Fail {
		// Synchronous, so that nothing the replica answers after the
		// release below comes from before its failure.
		if !failed[p] {
			ask(hosted[p], func(r *replica) bool { r.lose(why); return true })
		}
	}
	// A replica failed meanwhile (fenced: settleFeedsOut) sends nothing
	// it held either: it may have run txns of this process that no live
	// replica elsewhere will.
	stands := map[uint32]bool{}
	for p, r := range hosted {
		if ok, _ := ask(r, func(r *replica) bool { return r.core.Executing() }); ok {
			stands[p] = true
		}
	}
	n.feeds.release(func(p uint32) bool { _, failed := o.Fail[p]; return !failed && stands[p] })
	if len(o.Gaps) > 0 {
		n.log.Info("registration lapsed: replicas settled", "gaps", o.Gaps, "unknown", o.Unknown, "partitions_missed", len(o.Missed), "failed", len(o.Fail), "kept_alone", o.Alone)
	}
	return true
}

// settleFeedsOut waits, after a lapse, until this node's initiator has a
// feed open to every node alive: a node that took this process for dead
// (its feed from here ended while its view had this node dead) repaired
// this initiator's tail with its peers and ran on without what was past
// it, and says so in answer to the redial (wire.Fenced), which fails the
// replicas here that it holds live before the feed opens
// (initiator.fenced). Only then may a replica here answer again: one that
// ran a txn of this process that the others never will must not be read
// (docs/DESIGN.md "Feeds that resume"). A node not reached within
// missedWait may have done the same: the replicas here of the partitions
// it holds live fail. False: ctx ended first.
//
// Meanwhile the results of each partition o keeps go out as soon as every
// live holder of it has a feed from here (freeSettled).
func (n *Node) settleFeedsOut(ctx context.Context, o recovery.SettleOutcome, hosted map[uint32]*replica, failed map[uint32]bool) bool {
	deadline := time.Now().Add(missedWait)
	for {
		v := n.members.view()
		unfed, _ := n.init.unfed(v, time.Time{}, time.Time{})
		if len(unfed) == 0 {
			return true
		}
		n.freeSettled(o, hosted, failed)
		if !time.Now().Before(deadline) {
			slices.Sort(unfed)
			failed := 0
			for p, r := range n.hosted() {
				for _, pl := range v.placement[p] {
					if pl.live && slices.Contains(unfed, pl.node) {
						why := fmt.Sprintf("registration lapsed and no feed to %s opened within %v: it may have taken this process for dead and run on without its last txns", pl.node, missedWait)
						ask(r, func(r *replica) bool { r.lose(why); return true })
						failed++
						break
					}
				}
			}
			n.log.Warn("registration lapsed: no feed opened to some live nodes; their partitions' replicas here fail", "nodes", unfed, "failed", failed)
			return true
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return false
		}
	}
}

// freeSettled sends the held results of the replicas here of the
// partitions o settled to keep, once every live holder of the partition
// has a feed open from here (so none of them can still answer this
// process as fenced: settleFeedsOut), and passes their results on from
// then, while the settlement goes on for the others. Before, a lapse
// settled as a whole: a settlement waiting for a node cut off held every
// result until that node was fenced, in partitions it holds no replica of
// too (rejoin chaos --net-faults on --seed 20261128, 10m, +81.84 s:
// 1.35 s without a successful op; TestLapseSettlesApartFromACutNode).
//
// The replicas of the partitions o settled to fail fail at once, noted
// in failed: live in etcd until then, they held every call of their
// partition, which waited for their results (the same seed, +81.85 s:
// n1's settlement failed the three partitions a fenced node had written
// without it, and waited 1.7 s for a node reset from its peers, which
// held none of them, before it did).
func (n *Node) freeSettled(o recovery.SettleOutcome, hosted map[uint32]*replica, failed map[uint32]bool) {
	for p, why := range o.Fail {
		if r := hosted[p]; r != nil && !failed[p] {
			failed[p] = true
			ask(r, func(r *replica) bool { r.lose(why); return true })
		}
	}
	v := n.members.view()
	unfed, _ := n.init.unfed(v, time.Time{}, time.Time{})
	var ps []uint32
	for p, r := range hosted {
		if _, failed := o.Fail[p]; failed || o.Pending[p] || n.feeds.freed(p) {
			continue
		}
		if slices.ContainsFunc(v.placement[p], func(pl replicaPlace) bool { return pl.live && slices.Contains(unfed, pl.node) }) {
			continue
		}
		if ok, _ := ask(r, func(r *replica) bool { return r.core.Executing() }); ok {
			ps = append(ps, p)
		}
	}
	if len(ps) > 0 {
		slices.Sort(ps)
		n.log.Info("registration lapsed: partitions settled, their results sent, while the settlement goes on", "partitions", ps, "wait_for", o.WaitFor, "pending", len(o.Pending), "unfed", unfed)
	}
	n.feeds.free(ps)
}

// holders returns, for each partition of hosted, every node that may have
// sequenced its txns since the outage that began with out.view was, until
// the node's registration at revision upto: a node sequences a
// partition's txns only while its own view has it hold a replica
// (Node.sequence), and that view is at least as new as what its record
// said in view (its ViewRev), or, for a process registered since, as its
// registration (viewBehindTerm). So the holders then, now (the view read
// after registering again), and every node whose replica record was
// created or deleted since the oldest of those views (etcd's history).
// last says, of the same views, when each node's replica of each
// partition was last live for the cluster (othersLive). Nil, and no
// error, if that history is compacted or a view said nothing: every node
// may have sequenced every partition, and held it live.
func (n *Node) holders(ctx context.Context, out *outage, upto int64, hosted map[uint32]*replica) (holders map[uint32][]string, last supervise.LastLive, err error) {
	view := out.view
	if view == nil || len(view.nodes) == 0 {
		return nil, nil, nil
	}
	// From no later than the revision the node was last registered at
	// either: its record went after it, and only a view without the
	// record can have had a call sequenced without this node.
	from := min(view.rev, out.rev)
	for id, rec := range view.nodes {
		// This node's own view is view itself; its record's ViewRev is
		// older (0 while the record is its term's first write), and
		// would leave the holders unknown.
		if id != n.id {
			from = min(from, rec.ViewRev)
		}
	}
	if from <= 0 {
		return nil, nil, nil
	}
	hctx, cancel := context.WithTimeout(ctx, historyTimeout)
	defer cancel()
	placed, live, err := supervise.ReplicasBetween(hctx, n.cli, from, upto)
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return nil, nil, nil
	case err != nil:
		return nil, nil, err
	}
	now := n.members.view()
	holders = make(map[uint32][]string, len(hosted))
	for p := range hosted {
		hs := slices.Concat(view.holders(p), now.holders(p), placed[p])
		slices.Sort(hs)
		holders[p] = slices.Compact(hs)
	}
	return holders, live, nil
}

// othersLive returns, for each partition of hosted, the other nodes whose
// replica of it last was live at or after revision since (0: at any
// revision holders read; recovery.SettleInput's and SettleProcess's
// Others).
func (n *Node) othersLive(last supervise.LastLive, since int64, hosted map[uint32]*replica) map[uint32][]string {
	live := last.Since(since)
	others := make(map[uint32][]string, len(hosted))
	for p := range hosted {
		others[p] = slices.DeleteFunc(live[p], func(node string) bool { return node == n.id })
	}
	return others
}

// missedWait bounds the wait, after a lapse, for the feed of a node that
// did not keep its feed open throughout: it dials within a membership
// poll of seeing this node registered again, and its feed opens once the
// tail of its previous one here is settled.
const missedWait = 30 * time.Second

// settleRead fills in what a settlement reads again while it waits: the
// membership, the feeds in now, and what their hellos told, since the
// hello numbered tellsFrom (the outage's start) or before.
func (n *Node) settleRead(in *recovery.SettleInput, conns map[*feedIn]uint64, tellsFrom uint64) {
	in.Alive = map[string]uint64{}
	for node, rec := range n.members.view().nodes {
		in.Alive[node] = uint64(incarnation(rec))
	}
	feeds, _ := n.feedsNow()
	in.Now = settleFeeds(feeds, conns)
	in.Told = n.feeds.toldSince(tellsFrom)
}

// settleFeeds describes feeds to recovery.Settle, naming each connection
// by a number of its own in conns (the same feed, the same number).
func settleFeeds(feeds map[txnid.Initiator]*feedIn, conns map[*feedIn]uint64) []recovery.SettleFeed {
	out := make([]recovery.SettleFeed, 0, len(feeds))
	for _, fi := range feeds {
		c, ok := conns[fi]
		if !ok {
			c = uint64(len(conns) + 1)
			conns[fi] = c
		}
		out = append(out, recovery.SettleFeed{Node: fi.node, Inc: fi.inc, Conn: c})
	}
	return out
}

// feedsNow copies the feeds in, with the count of hellos so far.
func (n *Node) feedsNow() (map[txnid.Initiator]*feedIn, uint64) {
	n.feeds.mu.Lock()
	defer n.feeds.mu.Unlock()
	out := make(map[txnid.Initiator]*feedIn, len(n.feeds.by))
	for in, fi := range n.feeds.by {
		out[in] = fi
	}
	return out, n.feeds.tells
}

// historyTimeout bounds the read of the registrations made while the
// node was not registered.
const historyTimeout = 10 * time.Second

// unpublished marks replica p's state as not written to etcd (etcd did
// not answer); published clears it.
func (n *Node) unpublished(p uint32, yes bool) {
	n.pubMu.Lock()
	defer n.pubMu.Unlock()
	if yes {
		n.unpub[p] = true
	} else {
		delete(n.unpub, p)
	}
}

// republishLoop republishes at once, then every second, while the term
// lasts.
func (n *Node) republishLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		n.republish(ctx, false)
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// republish writes the state of every replica whose change could not be
// published (while etcd was unreachable), so that no initiator waits for
// a replica that stopped executing, and no rejoin source is picked from
// one that holds nothing. With failedOnly, only the replicas no longer
// live: what settle publishes before it settles.
func (n *Node) republish(ctx context.Context, failedOnly bool) {
	n.pubMu.Lock()
	ps := make([]uint32, 0, len(n.unpub))
	for p := range n.unpub {
		ps = append(ps, p)
	}
	n.pubMu.Unlock()
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	for _, p := range ps {
		r := n.hosted()[p]
		if r == nil {
			n.unpublished(p, false) // moved off this node meanwhile
			continue
		}
		// Under pubMu, read and written as one: a change published
		// meanwhile is not overwritten by the state read before it.
		r.pubMu.Lock()
		type stateHeld struct {
			state recovery.ReplicaState
			held  string
		}
		sh, ok := ask(r, func(r *replica) stateHeld { return stateHeld{r.core.State(), r.core.Held()} })
		if !ok {
			r.pubMu.Unlock()
			return
		}
		state := sh.state
		sstate := recovery.ReplicaNeedsRejoin
		if state == recovery.ReplicaLive {
			if failedOnly {
				r.pubMu.Unlock()
				continue
			}
			sstate = recovery.ReplicaLive
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := supervise.UpdateReplica(wctx, n.cli, supervise.Replica{Partition: p, Node: n.id, State: sstate, Held: sh.held, Created: r.created})
		cancel()
		r.pubMu.Unlock()
		if errors.Is(err, supervise.ErrNotPlaced) {
			n.unpublished(p, false)
			continue
		}
		if err != nil {
			n.log.Warn("publish replica state again", "partition", p, "err", err)
			return
		}
		n.unpublished(p, false)
		n.log.Info("replica state published again", "partition", p, "state", sstate)
	}
}
