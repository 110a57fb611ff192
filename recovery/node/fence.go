package node

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/txnid"
)

// Fencing by the peers' word (docs/DESIGN.md): a process whose feed here
// stays lost is reported in etcd; a majority of the other nodes reporting
// it fences it in one transaction (supervise.FenceNode), and every node
// then takes it for dead at once, as a peer's repair answer does
// (answerRepair), instead of waiting a lease and a grace for it. A node
// paused or cut off from its peers stalled every partition for as long
// as the fault lasted.

// suspectAfter is how long a process's feed here brings nothing, ended
// and not taken up by a redial, before this node reports the process: a
// stall window and half a second. A feed reset while the process
// lives and reaches this node is redialled within milliseconds; a reset
// that lasts a second (TestFeedResetsLoseNothing) must not fence every
// node.
const suspectAfter = feedStallWindow + 500*time.Millisecond

// fenceEvery is the period of the fence loop: reports, fences due,
// fences to apply.
const fenceEvery = 100 * time.Millisecond

// fenceTryEvery bounds how often the node tries to fence one process.
const fenceTryEvery = 500 * time.Millisecond

// cutAfter is how long a process stays among the cut's picks in this
// node's views (supervise.CutPlan) before this node fences it as the
// first (supervise.Fencer). The reports of one fault come in over a loop
// or two of each reporter (each files its own once its feed has been
// silent suspectAfter): picked on the first of them, a 2|3 split could
// fence a node of the three before the rest came in and a majority
// fenced the two.
const cutAfter = 500 * time.Millisecond

// fenceCallTimeout bounds each etcd call of the loop.
const fenceCallTimeout = time.Second

type reportMine struct {
	inc   int64
	lease clientv3.LeaseID
}

// fences runs the fence loop until the node stops: what to fence is
// supervise.Fencer's, the etcd calls are this loop's.
func (n *Node) fences() {
	applied := map[string]int64{} // node → the fence revision applied here
	mine := map[string]reportMine{}
	unfed := map[string]time.Time{}
	f := supervise.NewFencer(n.id, cutAfter, fenceTryEvery, n.cfg.knobs.noCutFence)
	t := time.NewTicker(fenceEvery)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		v := n.members.view()
		if v == nil {
			continue
		}
		n.applyFences(v, applied)
		// Registered, not settled: a lapse's settlement waits for a feed
		// to every live node, and a node cut off from every peer is not
		// one until it is fenced (rejoin chaos --net-faults on --seed 5511:
		// an etcd pause ended every lease, and the settlements waited for
		// a cut-off node that the unsettled nodes did not report, 9.4 s
		// without service in every partition).
		if n.reg == nil || !n.reg.Registered() {
			continue
		}
		now := time.Now()
		suspects, quick := n.suspectsWhy(now, n.reg.Term().Began(), v, unfed)
		n.reportSuspects(v, suspects, quick, mine)
		for _, try := range f.Next(now, v.fence, suspects) {
			f.Tried(now, try.Node)
			msg := "node fenced: a majority of the cluster hears nothing from it"
			if try.Cut {
				msg = "node fenced: a cut between nodes that no majority reports (supervise.CutDue)"
			}
			// The next fence waits for a view with this one in: its
			// reporters may have been fenced by another.
			if n.tryFence(v, try.Due, msg) {
				break
			}
		}
	}
}

// tryFence fences d's node by the guarded transaction (supervise.FenceNode)
// and reports whether it went through; it logs it as msg.
func (n *Node) tryFence(v *view, d supervise.Due, msg string) bool {
	rec := v.fence.Nodes[d.Node]
	var reporters []supervise.NodeRecord
	for _, id := range d.Reporters {
		reporters = append(reporters, v.fence.Nodes[id])
	}
	ctx, cancel := context.WithTimeout(n.ctx, fenceCallTimeout)
	ok, err := supervise.FenceNode(ctx, n.cli, n.id, rec, reporters)
	cancel()
	if err != nil {
		n.limited.Log(slog.LevelWarn, "fence/"+d.Node, "fencing a reported node failed; retrying", "node", d.Node, "err", err)
		return false
	}
	if ok {
		n.log.Warn(msg, "node", d.Node, "inc", incarnation(rec), "reporters", d.Reporters)
	}
	return ok
}

// suspects lists the processes this node would report: each one alive
// in the membership whose latest feed here ended, brought nothing for
// suspectAfter and was not taken up by a redial; or which has opened no
// feed here for as long since this node saw it alive, as a process that
// reaches this node does within milliseconds of seeing it registered.
// (Reports from lost feeds alone left out the nodes that restarted while
// a node was cut off, which never had its feed, and no majority reported
// it: chaos seed 5511, 10 s without service over a 2|3 split; with twice
// suspectAfter, 7.2 s.) unfed
// keeps, across calls, when each process was first seen alive with no
// feed here. No silence counts from before since, when this node's
// registration began: out of the others' view, it was fed by none that
// had lost its feed here, as they dial only the nodes in their view, so
// a silence of then says nothing of them. Counted from before, a fenced
// node that registered again on one side of a split reported the nodes
// of its own side at once, and with the other side's reports fenced
// them (TestFencedNodeBackOnTheMajoritySide, one run in two under
// -race).
func (n *Node) suspects(now, since time.Time, v *view, unfed map[string]time.Time) map[string]int64 {
	out, _ := n.suspectsWhy(now, since, v, unfed)
	return out
}

// suspectsWhy is suspects, with the nodes among them reported for a feed
// that ended while their record stood still (endedAndQuiet).
func (n *Node) suspectsWhy(now, since time.Time, v *view, unfed map[string]time.Time) (out map[string]int64, quick map[string]bool) {
	latest := map[string]*feedIn{}
	n.feeds.mu.Lock()
	for _, fi := range n.feeds.last {
		if l := latest[fi.node]; l == nil || fi.inc > l.inc {
			latest[fi.node] = fi
		}
	}
	n.feeds.mu.Unlock()
	out, quick = map[string]int64{}, map[string]bool{}
	seen := map[string]bool{}
	for node, rec := range v.nodes {
		inc := incarnation(rec)
		if node == n.id {
			continue
		}
		fi := latest[node]
		var silent time.Time
		if fi != nil && int64(fi.inc) == inc && untracked(fi) {
			// Taken for dead here, and not fed here since: silent
			// since its feed went silent, not since this node saw
			// that. Counted from now, the report filed on the lost
			// feed was withdrawn when its tail was repaired and filed
			// again 1.5 s later, and a process that registered again
			// while cut off outlasted a 4.2 s cut unfenced (chaos
			// seed 175139113; TestSuspectsKeepAnUntrackedSilence).
			if at := fi.silentSince.Load(); at != 0 {
				silent = time.Unix(0, at)
			}
			fi = nil
		}
		if fi == nil || int64(fi.inc) != inc {
			key := fmt.Sprintf("%s@%d", node, inc)
			seen[key] = true
			first, ok := unfed[key]
			if !ok {
				first = now
				if !silent.IsZero() && silent.Before(now) {
					first = silent
				}
				unfed[key] = first
			}
			if now.Sub(later(first, since)) >= suspectAfter || n.reportNow(node, inc, false) {
				out[node] = inc
			}
			continue
		}
		at := fi.silentSince.Load()
		if n.reportNow(node, inc, at == 0) {
			out[node] = inc
			continue
		}
		if n.endedAndQuiet(fi, node, now, since) {
			out[node], quick[node] = inc, true
			continue
		}
		if at == 0 || now.Sub(later(time.Unix(0, at), since)) < suspectAfter {
			continue
		}
		select {
		case <-fi.resolved:
			continue // taken up by a redial, or taken for dead here
		default:
		}
		out[node] = inc
	}
	for key := range unfed {
		if !seen[key] {
			delete(unfed, key)
		}
	}
	return out, quick
}

// recordQuiet is how long a process's record stands unchanged in this
// node's views, after its feed here ended by a close or a reset and no
// redial took it up, before this node reports it at once rather than
// suspectAfter after the end: three of its activity updates
// (supervise.ActivityEvery). A process that lives and reaches etcd
// updates its record meanwhile, so a reset between live processes
// that reach etcd waits suspectAfter as before, and resumes
// (TestFeedResetsLoseNothing); a killed process's connections end at
// once and it writes nothing more, so the partitions it held wait for
// about half a second, not for suspectAfter (TestKillFencedByQuiet).
const recordQuiet = 3 * supervise.ActivityEvery

// endedGrace is how long after a feed's end by a close or a reset a
// redial of a live process has to take it up before the end counts:
// one comes within milliseconds.
const endedGrace = 200 * time.Millisecond

// endedAndQuiet reports whether node's process, whose latest feed here
// is fi, is gone by the look of both its connection and etcd (docs/
// DESIGN.md "A kill found by its silence in etcd"): fi ended by a close
// or a reset endedGrace ago or more and was not taken up, and the
// process's record has stood unchanged recordQuiet while this node's
// own changed. No time counts from before since, as with suspectAfter.
func (n *Node) endedAndQuiet(fi *feedIn, node string, now, since time.Time) bool {
	at := fi.endedAt.Load()
	if at == 0 || now.Sub(later(time.Unix(0, at), since)) < endedGrace {
		return false
	}
	select {
	case <-fi.resolved:
		return false
	default:
	}
	quiet, ok := n.members.quietFor(node, n.id, now)
	return ok && quiet >= recordQuiet && now.Sub(since) >= recordQuiet
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// untracked reports whether fi ended and its process was taken for dead
// here (its tail repaired).
func untracked(fi *feedIn) bool {
	select {
	case <-fi.resolved:
		return fi.untracked
	default:
		return false
	}
}

// reportSuspects brings this node's reports in etcd to suspects: each
// under the current term's lease, withdrawn once the process is heard
// from again or gone.
func (n *Node) reportSuspects(v *view, suspects map[string]int64, quick map[string]bool, mine map[string]reportMine) {
	lease := n.reg.Lease()
	call := func(f func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(n.ctx, fenceCallTimeout)
		defer cancel()
		return f(ctx)
	}
	for node, inc := range suspects {
		if m, ok := mine[node]; ok && m.inc == inc && m.lease == lease {
			continue
		}
		if err := call(func(ctx context.Context) error { return supervise.PutReport(ctx, n.cli, lease, n.id, node, inc) }); err != nil {
			n.limited.Log(slog.LevelWarn, "report/"+node, "reporting a silent node failed; retrying", "node", node, "err", err)
			continue
		}
		mine[node] = reportMine{inc, lease}
		if quick[node] {
			n.log.Warn("node reported: its feed here ended and its record stands still in etcd", "node", node, "inc", inc)
		} else {
			n.log.Warn("node reported: its feed here stays lost", "node", node, "inc", inc)
		}
	}
	withdraw := map[string]bool{}
	for node := range mine {
		if _, ok := suspects[node]; !ok {
			withdraw[node] = true
		}
	}
	for node := range v.reported {
		if _, ok := suspects[node]; !ok {
			withdraw[node] = true
		}
	}
	for node := range withdraw {
		if err := call(func(ctx context.Context) error { return supervise.DeleteReport(ctx, n.cli, n.id, node) }); err != nil {
			n.limited.Log(slog.LevelWarn, "report/"+node, "withdrawing a report failed; retrying", "node", node, "err", err)
			continue
		}
		if _, ok := mine[node]; ok {
			n.log.Info("report withdrawn", "node", node)
		}
		delete(mine, node)
	}
}

// applyFences takes each process fenced in v, and not yet here, for
// dead: its feeds here are shut and closed, and their loss repairs its
// tail from the peers at once (answerRepair, feedLost). A fence of this
// process answers its calls in flight (recovery.Initiator.Abandon).
func (n *Node) applyFences(v *view, applied map[string]int64) {
	for node, f := range v.fences {
		if applied[node] == f.Rev {
			continue
		}
		applied[node] = f.Rev
		if node == n.id {
			if uint64(f.Inc) >= n.incarnation() {
				// Its peers took it for dead and will not answer the
				// calls in flight: their callers are told at once, and
				// try another node.
				n.init.mu.Lock()
				pending := n.init.core.Pending()
				n.init.core.Abandon("this node was fenced: its peers hear nothing from it, and the txn's outcome is unknown")
				n.init.mu.Unlock()
				n.log.Warn("this process was fenced by its peers: calls in flight answered as of unknown outcome", "by", f.By, "calls", pending)
			}
			continue
		}
		n.feeds.mu.Lock()
		var ins []txnid.Initiator
		for in, fi := range n.feeds.last {
			if fi.node == node && fi.inc <= uint64(f.Inc) {
				ins = append(ins, in)
			}
		}
		n.feeds.mu.Unlock()
		for _, in := range ins {
			n.log.Warn("process fenced by its peers' reports: taken for dead here", "node", node, "initiator", in, "by", f.By)
			n.answerRepair(in, uint64(f.Inc))
		}
	}
}

// fenced reports whether node, gone from the view, was fenced: its
// process is dead without a grace.
func (m *members) fenced(node string) bool { return m.fencedAs(node, 0) }

// fencedAs reports whether node's process inc is fenced in the view: a
// fence of inc or a later one stands and the node is not alive.
func (m *members) fencedAs(node string, inc uint64) bool {
	v := m.view()
	if v == nil {
		return false
	}
	_, alive := v.nodes[node]
	f, ok := v.fences[node]
	return ok && !alive && uint64(f.Inc) >= inc
}

// mayRegister is the registration's gate (supervise.NodeOptions): a
// process fenced registers again only once its initiator has a feed to
// every other node alive that opened after the node took it for dead: one that node answered wire.Fenced during the last term or
// since (or told so ahead of the floor: fencedEarly), or one opened
// since the last term ended (a node that saw the
// fence before the feed closed takes the process in without Fenced).
// Registered sooner, the others would wait for its replicas again while
// it cannot reach them. Counting only the feeds opened since the term
// ended, a process cut from its peers and etcd that came back to its
// peers, answered Fenced by each, before its own lease window ran out
// never counted them, as nothing reopened them again, and never
// registered (rejoin chaos --net-faults on --seed 175139113;
// TestFencedBeforeItsTermEnded).
// Not all, though: a node fenced and then cut from one peer that is cut
// from the rest as well waited for it, and its reports, which count only
// once it is registered, were the ones missing to fence that peer (rejoin
// chaos --net-faults on --seed 370535702: a partition 16 s without
// service). So it registers when the nodes it reaches are, with it, a
// majority of the cluster and each node it does not reach is reported by
// enough of the others that its own report completes the fence
// (supervise.MayRegister, DueOnceReported): registered, it reports
// them and they are fenced, where no one could fence them while it stayed
// out (rejoin chaos --net-faults on --seed 697575384;
// TestFencedNodeBackOnTheMajoritySide). It clears its fence as it passes.
func (n *Node) mayRegister(ctx context.Context, prev *supervise.Term) error {
	f, ok, err := supervise.ReadFence(ctx, n.cli, n.id)
	if err != nil {
		return err
	}
	if !ok || uint64(f.Inc) < n.incarnation() {
		return nil
	}
	// The fence removed the record, which ended the term: a feed opened
	// since was answered by a node that had taken the process for dead,
	// or will be closed when it does. (Counted from when the fence was
	// first seen, the feeds a paused process redialled as it woke were
	// not, and it waited 9 s for feeds to open again: chaos seed 5511.)
	v := n.members.view()
	if n.init == nil || v == nil {
		return fmt.Errorf("node %s fenced by its peers: its feeds are not up yet", n.id)
	}
	unfed, fed := n.init.unfed(v, prev.Ended(), prev.Began())
	g, err := n.members.gate(n.id, fed, unfed, n.cfg.knobs.noCutFence)
	if err != nil {
		return fmt.Errorf("node %s fenced by its peers (%s's transaction): %w", n.id, f.By, err)
	}
	if err := supervise.ClearFence(ctx, n.cli, f); err != nil {
		return err
	}
	n.reportOnRegistering(g.Report, v.nodes)
	n.log.Warn("fence cleared: registering again", "fenced_by", f.By, "because", g.Why)
	return nil
}

// atOnce are the processes this node reports as it registers, by node:
// those its registration gate counted its report on (supervise.Gate.Report),
// reported in the registration's own transaction
// (reportsOnRegistering) and by the fence loop until heard (reportNow).
type atOnce struct {
	mu    sync.Mutex
	procs map[string]int64
}

// reportOnRegistering notes the processes of nodes, as recs has them,
// to report as this node registers.
func (n *Node) reportOnRegistering(nodes []string, recs map[string]supervise.NodeRecord) {
	n.atOnce.mu.Lock()
	defer n.atOnce.mu.Unlock()
	n.atOnce.procs = map[string]int64{}
	for _, id := range nodes {
		if rec, ok := recs[id]; ok {
			n.atOnce.procs[id] = incarnation(rec)
		}
	}
}

// reportsOnRegistering are the processes to report in the registration's
// own transaction (supervise.NodeOptions.ReportOnRegister).
func (n *Node) reportsOnRegistering() map[string]int64 {
	n.atOnce.mu.Lock()
	defer n.atOnce.mu.Unlock()
	return maps.Clone(n.atOnce.procs)
}

// reportNow reports whether node's process inc is one to report at once;
// heard says a feed of it here is open and not silent, which ends that.
func (n *Node) reportNow(node string, inc int64, heard bool) bool {
	n.atOnce.mu.Lock()
	defer n.atOnce.mu.Unlock()
	p, ok := n.atOnce.procs[node]
	if ok && heard {
		delete(n.atOnce.procs, node)
	}
	return ok && p == inc && !heard
}

// gate is supervise.MayRegister on the records read last.
func (m *members) gate(id string, fed, unfed []string, noCutFence bool) (supervise.Gate, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return supervise.MayRegister(m.recs, id, fed, unfed, noCutFence)
}

// unfed lists the nodes alive in v, this one aside, that the initiator
// has no feed open to, or none opened since since or answered
// wire.Fenced at an open since fencedSince (zero times: any feed open
// counts); fed lists the others alive in v, this one aside.
func (in *initiator) unfed(v *view, since, fencedSince time.Time) (unfed, fed []string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for node := range v.nodes {
		if node == in.n.id {
			continue
		}
		o := in.opened[node]
		counts := in.core.Fed(node) && (!o.at.Before(since) || o.fenced && !o.at.Before(fencedSince))
		if at, ok := in.toldFenced[node]; ok && !at.Before(fencedSince) {
			counts = true // its floor waits for its repair of this process's tail
		}
		if counts {
			fed = append(fed, node)
		} else {
			unfed = append(unfed, node)
		}
	}
	return unfed, fed
}
