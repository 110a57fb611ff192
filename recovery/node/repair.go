package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// The repair of a dead initiator's tail (DESIGN.md's initiator, step 2's
// feed): an initiator sends each txn to every replica of the partition,
// one feed per node; a node that dies mid-send may leave some replicas
// with a txn the others never got. Feeds are TCP streams in ID order, so
// each survivor holds a prefix of the initiator's sequence, and while the
// initiator is still in a replica's safe-point tracker nothing past that
// prefix has run there. Before a replica stops waiting for the dead
// initiator it asks every live peer replica of the partition for that
// initiator's txns past its own prefix and takes them in; every survivor
// then holds the longest prefix any survivor got, and they execute the
// same txns. A peer asked takes the process for dead too and closes its
// feed from it, if still open (answerRepair). A live peer that cannot be
// reached is asked again until it answers or dies: the replica holds
// rather than fail on a network fault. A peer that no longer keeps the
// range asked for fails the replica: it rejoins rather than risk
// diverging (recovery.TailRepair).

// took records a txn or heartbeat id the replica took in from its
// initiator, and the txn itself (inv not nil) for repairs.
func (r *replica) took(id txnid.ID, inv *partition.Invocation) {
	r.tails.Took(id, inv, r.incOf[id.Initiator()])
}

// executing reports whether the replica takes in its feed: live, or
// buffering for a rejoin attempt.
func (r *replica) executing() bool { return r.core.Executing() }

// repairTxn takes in a txn a peer had and this replica did not.
func (r *replica) repairTxn(inv partition.Invocation) {
	if !r.executing() || inv.ID <= r.tails.Last(inv.ID.Initiator()) {
		return // already here (another peer sent it first)
	}
	r.onTxn(inv)
}

// resolveInitiator repairs r's tail of initiator in's incarnation inc
// from its live peers and says whether the replica then fails. deadNode
// is the initiator's node. Whom to ask, how long to retry and when the
// repair counts as failed is recovery.TailRepair's rule: a live peer
// that cannot be reached is asked again until it answers or dies, with a
// pause that grows to repairRetryMax. If the run is cut short first, the
// verdict does not count (resolveAll).
func (n *Node) resolveInitiator(run *tailRun, r *replica, in txnid.Initiator, deadNode string, inc uint64) (why string, fail bool) {
	var nodes []string
	for _, pl := range n.members.view().placement[r.p] {
		nodes = append(nodes, pl.node)
	}
	t := recovery.NewTailRepair(in, nodes, n.id, deadNode)
	for peer, ok := t.Next(); ok && run.ctx.Err() == nil; peer, ok = t.Next() {
		pause := 200 * time.Millisecond
		for since := time.Now(); ; {
			taken, err := n.repairFrom(run, r, in, inc, peer)
			if err == nil && taken > 0 {
				n.log.Info("initiator tail repaired", "partition", r.p, "initiator", in, "from", peer, "txns", taken)
			}
			var gone *tailGoneError
			try := recovery.RepairTry{Err: err, Gone: errors.As(err, &gone), PeerAlive: !n.deadFor(peer), Ended: run.ctx.Err() != nil}
			if !t.OnAnswer(peer, try) {
				break
			}
			n.limited.Log(slog.LevelWarn, fmt.Sprintf("repair-wait/%d/%d/%s", r.p, in, peer),
				"a dead initiator's tail waits for a live peer that does not answer: the replica holds until it does or dies",
				"partition", r.p, "initiator", in, "peer", peer, "waited", time.Since(since).Round(time.Millisecond), "err", err)
			n.repairPause(run.ctx, peer, pause)
			pause = min(2*pause, n.repairRetryMax())
		}
	}
	return t.Verdict()
}

// repairRetryMax bounds the pause between two asks of a peer that did not
// answer: about how long a repair lags the peer's return.
const repairRetryMax = time.Second

// repairRetryMax is the const unless a test set knobs.repairRetryMax.
func (n *Node) repairRetryMax() time.Duration {
	if d := n.cfg.knobs.repairRetryMax; d > 0 {
		return d
	}
	return repairRetryMax
}

// repairDeadPoll is how often a repair looks whether the peer it waits
// for died (untilDead).
const repairDeadPoll = 20 * time.Millisecond

// untilDead returns a channel closed once peer is dead here (deadFor),
// polled every repairDeadPoll until ctx ends: a repair stops waiting for
// it then, since the tail is settled without it.
func (n *Node) untilDead(ctx context.Context, peer string) <-chan struct{} {
	dead := make(chan struct{})
	go func() {
		t := time.NewTicker(repairDeadPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if n.deadFor(peer) {
					close(dead)
					return
				}
			}
		}
	}()
	return dead
}

// repairPause waits pause before peer is asked again, and ends as soon as
// peer is dead here: then the tail is settled without it. A dial into
// dropped packets is cut at the fence already (repairFrom), but where
// the peer's connections are reset each ask fails at once, and the pause
// under way held the replica, and every call of its partition, for up to
// repairRetryMax past the fence (TestRepairEndsAtThePeersFence, with the
// pause raised to 6 s: the first write came 5.4-5.5 s after the fence,
// 0.14-0.19 s with this).
func (n *Node) repairPause(ctx context.Context, peer string, pause time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, pause)
	defer cancel()
	select {
	case <-ctx.Done():
	case <-n.untilDead(ctx, peer):
	}
}

// tailGoneError: a peer holds txns past the asker's prefix that it no
// longer keeps.
type tailGoneError struct{ msg string }

func (e *tailGoneError) Error() string { return e.msg }

// tailRun is one node's repair of a process's tail, on every replica
// (resolveAll). Until its first request goes out it may be cut short
// (the process came back); from then on it runs to its end, since the
// peer that answers takes the process for dead too (answerRepair): a
// node that went on waiting for the process and resumed its feed would
// run txns that peer never gets.
type tailRun struct {
	ctx       context.Context
	mu        sync.Mutex
	cancel    context.CancelFunc
	committed bool
}

func newTailRun(parent context.Context) *tailRun {
	ctx, cancel := context.WithCancel(parent)
	return &tailRun{ctx: ctx, cancel: cancel}
}

// commit reports whether a request may go out: the run was not cut
// short, and from now on it will not be.
func (t *tailRun) commit() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx.Err() != nil {
		return false
	}
	t.committed = true
	return true
}

// cutShort ends the run unless a request went out; it reports whether
// it did.
func (t *tailRun) cutShort() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.committed {
		return false
	}
	t.cancel()
	return true
}

// isCommitted reports whether a request went out.
func (t *tailRun) isCommitted() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.committed
}

// repairFrom asks peer for the txns of in's incarnation inc past what r
// holds.
func (n *Node) repairFrom(run *tailRun, r *replica, in txnid.Initiator, inc uint64, peer string) (int, error) {
	type state struct {
		after txnid.ID
		ok    bool
	}
	st, ok := ask(r, func(r *replica) state { return state{r.tails.Last(in), r.executing()} })
	if !ok {
		return 0, fmt.Errorf("node stopping")
	}
	if !st.ok {
		return 0, nil // nothing to repair on a replica that holds nothing
	}
	addr, err := n.members.address(peer)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(run.ctx, repairTimeout)
	defer cancel()
	// A dial to a peer cut off waits out its timeout; the peer fenced
	// meanwhile is no longer waited for (recovery.TailRepair), so the
	// dial ends then. (A repair stuck in such a dial held every
	// partition 4 s past the fence of the peer it dialled: rejoin chaos
	// --net-faults on --seed 5511.) Not once the request went out: a
	// peer that began its answer has it read to its end or its break.
	var sent atomic.Bool
	dead := n.untilDead(ctx, peer)
	go func() {
		select {
		case <-ctx.Done():
		case <-dead:
			if !sent.Load() {
				cancel()
			}
		}
	}()
	cfg := n.dialConfig(peer)
	cfg.StallWindow = repairTimeout
	conn, err := stream.Dial(ctx, addr, cfg)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := hello(ctx, conn, &wire.Hello{Kind: wire.HelloRepair, Node: n.id}, peer); err != nil {
		return 0, err
	}
	if !run.commit() {
		return 0, run.ctx.Err()
	}
	sent.Store(true)
	if err := conn.Send(ctx, &wire.Repair{Partition: r.p, Initiator: uint16(in), After: st.after, Incarnation: inc}); err != nil {
		return 0, err
	}
	taken := 0
	for {
		m, err := conn.Recv()
		if err != nil {
			return taken, err
		}
		switch m := m.(type) {
		case *wire.Txn:
			if m.ID.Initiator() != in || m.Partition != r.p {
				return taken, fmt.Errorf("repair answered txn %v of partition %d", m.ID, m.Partition)
			}
			inv := partition.Invocation{ID: m.ID, Proc: m.Proc, Params: append([]byte(nil), m.Params...)}
			r.do(func(r *replica) { r.repairTxn(inv) })
			taken++
		case *wire.RepairEnd:
			if m.Err != "" && m.Last > st.after {
				// It holds more of the process than this replica, and
				// cannot give it.
				return taken, &tailGoneError{fmt.Sprintf("peer: %s", m.Err)}
			}
			if m.Err != "" {
				return taken, fmt.Errorf("peer: %s", m.Err)
			}
			return taken, nil
		default:
			return taken, fmt.Errorf("repair: unexpected %v", m.Type())
		}
	}
}

// repairTimeout bounds one peer's repair answer.
const repairTimeout = 5 * time.Second

// serveRepair answers the repair requests of peer (the hello's node,
// which authorize checked against the certificate) on one connection.
func (n *Node) serveRepair(c *stream.Conn, peer string) {
	for {
		m, err := c.Recv()
		if err != nil {
			return
		}
		req, ok := m.(*wire.Repair)
		if !ok {
			return
		}
		end := &wire.RepairEnd{Partition: req.Partition, Initiator: req.Initiator}
		txns, last, err := n.repairAnswer(req, peer)
		if err != nil {
			end.Err = wire.ErrText(err)
		}
		end.Last = last
		for i := range txns {
			inv := &txns[i]
			if err := c.Write(n.ctx, &wire.Txn{Partition: req.Partition, ID: inv.ID, Proc: inv.Proc, Params: inv.Params}); err != nil {
				return
			}
		}
		if err := c.Send(n.ctx, end); err != nil {
			return
		}
	}
}

// repairAnswer collects what this node's replica holds of the request's
// initiator incarnation past After, once it took that process for dead
// (answerRepair: nothing more of it reaches the replicas, so what they
// hold of it is final). A feed of a newer incarnation may be open
// meanwhile: its txns are not part of the answer. A partition not hosted
// here has nothing of the process that will run, like a replica that
// needs a rejoin. Only another holder of the partition is answered, and
// takes the process for dead here.
func (n *Node) repairAnswer(req *wire.Repair, peer string) ([]partition.Invocation, txnid.ID, error) {
	// A replica's txns go only to another holder of the partition: a
	// repair is how replicas of one partition agree on a dead initiator's
	// tail, not a way for any node to read a partition.
	if !slices.ContainsFunc(n.members.view().placement[req.Partition], func(rp replicaPlace) bool { return rp.node == peer }) {
		return nil, 0, fmt.Errorf("%s holds no replica of partition %d", peer, req.Partition)
	}
	in := txnid.Initiator(req.Initiator)
	if d := n.cfg.knobs.repairDelay; d > 0 {
		select {
		case <-time.After(d):
		case <-n.ctx.Done():
			return nil, 0, n.ctx.Err()
		}
	}
	n.peerRepairs(in, req.Incarnation)
	r := n.hosted()[req.Partition]
	if r == nil {
		return nil, 0, nil
	}
	type answer struct {
		txns []partition.Invocation
		last txnid.ID
		err  error
	}
	a, ok := ask(r, func(r *replica) answer {
		last := r.tails.Last(in)
		if !r.executing() {
			// It holds nothing that will ever run: its content goes, and a
			// rejoin brings what a live replica has. As a dead peer, it has
			// no longer prefix to give; an error here failed the asker,
			// maybe the partition's last live replica.
			return answer{}
		}
		txns, err := r.tails.After(in, req.After, req.Incarnation)
		return answer{txns: txns, last: last, err: err}
	})
	if !ok {
		return nil, 0, fmt.Errorf("node stopping")
	}
	return a.txns, a.last, a.err
}

// resolveAll repairs every replica's tail of a dead initiator
// incarnation, in parallel, and waits for them. It reports false if the
// run was cut short before a request went out: every replica still
// waits for the initiator.
func (n *Node) resolveAll(run *tailRun, in txnid.Initiator, deadNode string, inc uint64) bool {
	type verdict struct {
		why  string
		fail bool
	}
	hosted := n.hosted()
	// verdicts are those reached before the run committed, applied at
	// its end; a later one is applied at once.
	verdicts := make(map[*replica]verdict, len(hosted))
	apply := func(r *replica, v verdict) {
		r.do(func(r *replica) {
			// A newer process of the initiator that joined this
			// partition here stays: a replica that tracked none of
			// in's processes when it joined had no tail of this one to
			// wait for (joinReplica), and removed, it ran the other
			// initiators' txns past the new process's next ones, which
			// it then refused as too late, on every replica at once
			// (TestInitiatorBehindJoins: "partition 0 has no live
			// replica", 2 runs of 8).
			if r.incOf[in] <= inc {
				r.removeInitiator(in)
			}
			if v.fail {
				r.lose(v.why)
			}
		})
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, r := range hosted {
		wg.Add(1)
		go func() {
			defer wg.Done()
			why, fail := n.resolveInitiator(run, r, in, deadNode, inc)
			// Once a request went out the run is never cut short: the
			// process is dead here for good, no feed of it goes on, and
			// each replica stops waiting as soon as its own tail is
			// settled. Held for the others, a partition waited for a
			// repair of another partition, whose peer was a new process
			// alive and unreachable, until that process was fenced
			// (TestFencedNodeBackBesideCutOffNewProcess: 1.8 s without
			// a write in a partition that process holds no replica of).
			if run.isCommitted() && run.ctx.Err() == nil {
				apply(r, verdict{why, fail})
				return
			}
			mu.Lock()
			verdicts[r] = verdict{why, fail}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if run.ctx.Err() != nil {
		// Cut short (or the node stops): every replica still waits for
		// the initiator, with what the peers sent it meanwhile (a
		// resumed feed skips those).
		return false
	}
	// Before the run committed, all or none: a replica that stopped
	// waiting while another of the same initiator's feed went on (a cut
	// short run) would take the feed's next txns in on one and not the
	// other.
	for r, v := range verdicts {
		apply(r, v)
	}
	return true
}
