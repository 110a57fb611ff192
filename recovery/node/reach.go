package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// A new process registers only once it reaches its peers (docs/DESIGN.md
// "A process that starts cut off"). Registered, it is alive in every
// peer's view, and every call of a partition it holds a replica of waits
// for a feed to it, whatever its replicas' state (recovery.Unfed); a
// process that started cut off from its peers held those partitions until
// the peers reported and fenced it, 1.5 s and more (rejoin chaos
// --net-faults on --seed 991340239: 3.58 s; --seed 20261208 replayed:
// 3.16 s, two processes restarted in turn on the cut-off side of a
// split). The gate is the one a fenced process passes to register again
// (supervise.MayRegister), on a HelloReach answered by each peer instead of a
// feed, which the initiator opens only once the node is registered.

// reachEvery is how often a process that does not reach its peers yet
// tries them again; reachDialTimeout bounds each try of one peer.
const (
	reachEvery       = 250 * time.Millisecond
	reachDialTimeout = time.Second
)

// reachLogEvery is how often the wait says why it goes on.
const reachLogEvery = 5 * time.Second

// reachPeers returns once supervise.MayRegister lets this process register
// with the peers it reaches, or when ctx ends.
func (n *Node) reachPeers(ctx context.Context) error {
	var logged time.Time
	started := time.Now()
	for tries := 1; ; tries++ {
		var recs *supervise.Membership
		if err := n.startStep(ctx, "read the membership", func(ctx context.Context) (err error) {
			recs, err = supervise.ListMembership(ctx, n.cli)
			return err
		}); err != nil {
			return err
		}
		fed, unfed := n.reach(ctx, recs)
		g, err := supervise.MayRegister(recs, n.id, fed, unfed, n.cfg.knobs.noCutFence)
		if err == nil {
			n.reportOnRegistering(g.Report, recs.Nodes)
			if tries > 1 {
				n.log.Info("peers reached: registering", "because", g.Why, "waited", time.Since(started).Round(time.Millisecond))
			}
			return nil
		}
		if time.Since(logged) >= reachLogEvery {
			logged = time.Now()
			n.log.Warn("not registering yet: a new process registers once it reaches its peers", "why", err, "waited", time.Since(started).Round(time.Millisecond))
		}
		t := time.NewTimer(reachEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// reach says HelloReach to each node registered in recs but this one, at
// once, and lists those that answered (fed) and those that did not.
func (n *Node) reach(ctx context.Context, recs *supervise.Membership) (fed, unfed []string) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, rec := range recs.Nodes {
		if id == n.id {
			continue
		}
		addr := rec.Address
		if f := n.cfg.knobs.peerAddr; f != nil {
			addr = f(id, addr)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := n.sayReach(ctx, id, addr)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				fed = append(fed, id)
			} else {
				unfed = append(unfed, id)
			}
		}()
	}
	wg.Wait()
	return fed, unfed
}

// sayReach dials node at addr and has its HelloReach answered.
func (n *Node) sayReach(ctx context.Context, node, addr string) error {
	dctx, cancel := context.WithTimeout(ctx, reachDialTimeout)
	defer cancel()
	conn, err := stream.Dial(dctx, addr, n.dialConfig(node))
	if err != nil {
		return err
	}
	defer conn.Close()
	// The answer comes within the dial's bound or not at all.
	stop := context.AfterFunc(dctx, func() { conn.Close() })
	defer stop()
	if err := hello(dctx, conn, &wire.Hello{Kind: wire.HelloReach, Node: n.id}, node); err != nil {
		return fmt.Errorf("reach %s: %w", node, err)
	}
	return nil
}
