package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// members is the node's view of the cluster, read from etcd every poll:
// the live nodes and where each partition's replicas are and whether they
// are live. Reads are cheap and lock-free for the reader of one view.
type members struct {
	n  *Node
	mu sync.Mutex
	v  *view
	// booted: once the cluster is bootstrapped it stays so.
	booted bool
}

type view struct {
	nodes     map[string]supervise.NodeRecord
	placement map[uint32][]replicaPlace
	// bootstrapped: every node of the placement has started once, so
	// client calls may be taken (supervise.Bootstrapped).
	bootstrapped bool
}

type replicaPlace struct {
	node string
	live bool
}

func (m *members) view() *view {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.v
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
func incarnation(rec supervise.NodeRecord) int64 { return rec.Started.UnixNano() }

// refreshTimeout bounds one read of the view: with etcd unreachable the
// view stays as last read (frozen) and the poll goes on.
const refreshTimeout = 2 * time.Second

// refresh reads etcd once.
func (m *members) refresh() error {
	ctx, cancel := context.WithTimeout(m.n.ctx, refreshTimeout)
	defer cancel()
	nodes, err := supervise.Nodes(ctx, m.n.cli)
	if err != nil {
		return err
	}
	reps, err := supervise.Replicas(ctx, m.n.cli)
	if err != nil {
		return err
	}
	v := &view{nodes: map[string]supervise.NodeRecord{}, placement: map[uint32][]replicaPlace{}}
	for _, r := range nodes {
		v.nodes[r.ID] = r
	}
	for _, r := range reps {
		_, alive := v.nodes[r.Node]
		v.placement[r.Partition] = append(v.placement[r.Partition], replicaPlace{node: r.Node, live: alive && r.State == supervise.ReplicaLive})
	}
	m.mu.Lock()
	booted := m.booted
	m.mu.Unlock()
	if !booted {
		if booted, err = supervise.Bootstrapped(ctx, m.n.cli, placedNodes(reps)); err != nil {
			return err
		}
	}
	v.bootstrapped = booted
	m.mu.Lock()
	m.v, m.booted = v, booted
	m.mu.Unlock()
	return nil
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

// run refreshes the view, and ends the rejoin attempts whose peer or, on
// the destination, any node of the partition failed (DESIGN.md step 8:
// the recovering side terminates its rejoin).
func (m *members) run() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-m.n.ctx.Done():
			return
		case <-t.C:
		}
		if err := m.refresh(); err != nil {
			if m.n.ctx.Err() == nil && !failing {
				m.n.log.Warn("reading cluster membership; the view stays as last read", "err", err)
			}
			failing = true
			continue
		}
		if failing {
			m.n.log.Info("cluster membership read again")
			failing = false
		}
		v := m.view()
		for _, r := range m.n.replicas {
			r.do(func(r *replica) { r.checkPeers(v) })
		}
	}
}
