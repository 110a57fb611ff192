package node

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

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
		if out == nil && n.ctx.Err() == nil {
			// At once: a feed that breaks and opens again from here on
			// must not count as open throughout; and a replica that may
			// miss txns from here on answers nothing until settled.
			feeds, tells := n.feedsNow()
			out = &outage{feeds: feeds, lapses: t.Lapses, rev: t.Revision(), tellsFrom: tells}
			n.feeds.hold()
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

// settle decides, once the node is registered again, whether its replicas
// may have missed txns while it was not. If its lease outlived the
// outage, no node took it for dead: nothing was missed. If the lease
// lapsed, other nodes stopped waiting for it, but every initiator whose
// feed into this node stayed open (the same connection from before the
// loss to now) sent it every txn: initiators keep a feed to a node etcd
// takes for dead (feed.go). An initiator of a live node without such a
// feed (a new process, or a feed that broke and was opened again) may
// have sequenced txns that never reached this node: then every replica
// is failed and rejoins. The nodes checked are those of the view read
// after registering again, and every node that registered between the
// last revision this node was registered at and its new record (etcd's
// history: also those dead since); a node registering later sees this
// one and waits for its feed to it. A history that cannot be read counts
// as a gap. False: the term ended before the check could be made; the
// next term makes it.
func (n *Node) settle(ctx context.Context, out *outage, t *supervise.Term) bool {
	if t.Lapses == out.lapses {
		n.log.Info("registration resumed on its lease: no node took this one for dead, its replicas missed nothing")
		n.feeds.release(func(uint32) bool { return true })
		return true
	}
	var meanwhile []supervise.NodeRecord
	for {
		err := n.members.refresh()
		if err == nil {
			hctx, cancel := context.WithTimeout(ctx, historyTimeout)
			meanwhile, err = supervise.RegisteredBetween(hctx, n.cli, out.rev, t.Created)
			cancel()
			if errors.Is(err, rpctypes.ErrCompacted) {
				meanwhile, err = []supervise.NodeRecord{{ID: "(history compacted)"}}, nil
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
	ids := map[string]bool{}
	for node := range n.members.view().nodes {
		ids[node] = true
	}
	for _, rec := range meanwhile {
		ids[rec.ID] = true
	}
	gaps := n.feedGaps(ids, out.feeds)
	if len(gaps) == 0 {
		n.log.Info("registration lapsed; the feed of every live node stayed open throughout: replicas stay live")
		n.feeds.release(func(uint32) bool { return true })
		return true
	}
	// Each gap's process says, when its feed opens, which partitions it
	// wrote without a feed here: only those replicas missed anything. A
	// gap that cannot say (a process of it that never opened a feed here,
	// or no feed from it in time) may have written any partition.
	missed := map[uint32][]string{}
	var unknown []string
	for _, node := range gaps {
		ps, ok := n.missedBy(ctx, node, out, meanwhile)
		if ctx.Err() != nil {
			return false
		}
		if !ok {
			unknown = append(unknown, node)
			continue
		}
		for _, p := range ps {
			missed[p] = append(missed[p], node)
		}
	}
	failed := map[uint32]bool{}
	for p, r := range n.hosted() {
		var why string
		switch {
		case len(unknown) > 0:
			why = fmt.Sprintf("registration lapsed and the feeds of %v did not stay open throughout; %v cannot say what they sent meanwhile: txns may have been missed", gaps, unknown)
		case len(missed[p]) > 0:
			why = fmt.Sprintf("registration lapsed, and %v sequenced txns of partition %d without a feed here meanwhile", missed[p], p)
		default:
			continue
		}
		failed[p] = true
		// Synchronous, so that nothing the replica answers after the
		// release below comes from before its failure.
		ask(r, func(r *replica) bool { r.fail(why); return true })
	}
	n.feeds.release(func(p uint32) bool { return !failed[p] })
	n.log.Info("registration lapsed: replicas settled", "gaps", gaps, "unknown", unknown, "partitions_missed", len(missed))
	return true
}

// missedWait bounds the wait, after a lapse, for the feed of a node that
// did not keep its feed open throughout: it dials within a membership
// poll of seeing this node registered again, and its feed opens once the
// tail of its previous one here is settled.
const missedWait = 30 * time.Second

// missedBy returns the partitions that node's processes sequenced txns
// of without a feed to this node, as the hellos of their feeds since the
// outage began said: the current process's, whose feed is waited for
// (boundedly), and every other process of it that registered meanwhile,
// whose feed may have ended since. False: a process of it that registered
// meanwhile never opened a feed here, or the live one's feed did not open
// in time. The process whose feed was open here when the registration was
// lost (in out.feeds) sent everything on it until it ended, and its tail
// is repaired as any dead initiator's. So did a process whose feed opened
// before the outage and ended before it began: what it told then was of
// an earlier time, a previous process of this node or an outage settled
// before, and counting it failed the last live replica of a partition
// (rejoin chaos seed 31337).
func (n *Node) missedBy(ctx context.Context, node string, out *outage, meanwhile []supervise.NodeRecord) ([]uint32, bool) {
	before := out.feeds
	deadline := time.Now().Add(missedWait)
	for time.Now().Before(deadline) {
		rec, alive := n.members.view().nodes[node]
		var inc uint64 // the live process's; 0: none
		if alive {
			inc = uint64(incarnation(rec))
		}
		var told []uint32
		for _, m := range meanwhile {
			minc := uint64(incarnation(m))
			if m.ID != node || minc == inc {
				continue
			}
			known := false
			for _, fi := range before {
				known = known || fi.node == node && fi.inc == minc
			}
			if known {
				continue
			}
			ps, hello, since := n.feeds.toldSince(node, minc, out.tellsFrom)
			switch {
			case since:
				told = append(told, ps...)
			case hello:
				// Its feed here opened before the outage and was gone
				// when it began: covered as a feed of out.feeds.
			default:
				return nil, false
			}
		}
		if !alive {
			// No process of it lives: each that did either had its feed
			// open here throughout (its tail is repaired as a dead
			// initiator's) or told what it sent without one.
			return told, true
		}
		n.feeds.mu.Lock()
		var found *feedIn
		for _, fi := range n.feeds.by {
			if fi.node == node && fi.inc == inc {
				found = fi
			}
		}
		n.feeds.mu.Unlock()
		if found != nil {
			// Every hello of the live process since the outage began:
			// a feed of it that opened and broke meanwhile told what
			// the open one, which names only what came after, does not.
			ps, _, _ := n.feeds.toldSince(node, inc, out.tellsFrom)
			return append(told, ps...), true
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return nil, false
		}
	}
	return nil, false
}

// feedGaps lists the nodes whose initiator's feed into this node is not
// the one open in before.
func (n *Node) feedGaps(nodes map[string]bool, before map[txnid.Initiator]*feedIn) []string {
	n.feeds.mu.Lock()
	byNode := map[string]*feedIn{}
	for _, fi := range n.feeds.by {
		byNode[fi.node] = fi
	}
	n.feeds.mu.Unlock()
	var gaps []string
	for node := range nodes {
		if fi := byNode[node]; fi == nil || before[fi.in] != fi {
			gaps = append(gaps, node)
		}
	}
	sort.Strings(gaps)
	return gaps
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
		n.republish(ctx)
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
// one that holds nothing.
func (n *Node) republish(ctx context.Context) {
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
		state, ok := ask(r, func(r *replica) string { return r.core.State().String() })
		if !ok {
			return
		}
		sstate := supervise.ReplicaNeedsRejoin
		if state == StateLive {
			sstate = supervise.ReplicaLive
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := supervise.UpdateReplica(wctx, n.cli, supervise.Replica{Partition: p, Node: n.id, State: sstate})
		cancel()
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
