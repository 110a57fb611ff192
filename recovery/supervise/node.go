package supervise

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// Limits of a node's registration.
const (
	// NodeTTLDefault is the node lease's TTL: how long after its last
	// keepalive a dead node is still taken for alive.
	NodeTTLDefault = 5 * time.Second
	// NodeTTLMax bounds it like a claim's.
	NodeTTLMax = claim.TTLMax
	// ActivityChecksPerWindow is how many activity updates a window holds:
	// one failed update must not lose the node.
	ActivityChecksPerWindow = 4
	// HeldClaimsMax bounds the claims a node gives up on loss.
	HeldClaimsMax = 1024
	// giveUpTimeout bounds the releases and the lease revoke a lost node
	// attempts: etcd may be the reason it is lost, and the claims' and the
	// node's leases expire on their own.
	giveUpTimeout = time.Second
)

// NodeOptions configure Register.
type NodeOptions struct {
	Address string
	// HTTP is the node's admin HTTP address, stored in the record.
	HTTP string
	// TTL of the node's lease (whole seconds). Default NodeTTLDefault.
	TTL time.Duration
	// Window: a node that reached etcd with no activity update for a
	// window is lost (seed 002). Default and maximum TTL/2, so it gives up
	// before its lease can expire and another node take its work over;
	// at least claim.WindowMin.
	Window time.Duration
	// OutgoingMax is stored in the record (see NodeRecord).
	OutgoingMax int
	Log         *slog.Logger
}

// Node is this process's registration in the cluster: the record under
// NodeKey on a lease kept alive, and an activity update every
// Window/ActivityChecksPerWindow. Context is cancelled, with the reason as
// its cause, when the registration is lost: the lease ended, the record
// was removed (by the health task), or no update reached etcd for a
// window. All the node's rejoin work derives from Context, and the claims
// given to Hold are released then, so a node cut off from etcd stops and
// gives its work up (seed 002) before its lease expires and the
// supervisor reassigns it.
type Node struct {
	cli    *clientv3.Client
	log    *slog.Logger
	lease  clientv3.LeaseID
	window time.Duration
	key    string

	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when run has returned

	mu     sync.Mutex
	rec    NodeRecord     // as last written; Created fixed
	claims []*claim.Claim // held; released on loss
}

// Register registers node id and starts keeping it alive. A record left by
// an earlier incarnation of id is overwritten: its lease is that
// incarnation's, now ended or ending.
func Register(ctx context.Context, cli *clientv3.Client, id string, opts NodeOptions) (*Node, error) {
	if err := checkID("node id", id, nodeIDBytesMax); err != nil {
		return nil, err
	}
	if len(opts.Address) > addressBytesMax || len(opts.HTTP) > addressBytesMax {
		return nil, fmt.Errorf("%w: address of %d bytes or http address of %d", ErrBadName, len(opts.Address), len(opts.HTTP))
	}
	if opts.TTL == 0 {
		opts.TTL = NodeTTLDefault
	}
	if opts.TTL < 0 || opts.TTL > NodeTTLMax {
		return nil, fmt.Errorf("%w: node ttl %s", ErrConfig, opts.TTL)
	}
	ttlSeconds := int64((opts.TTL + time.Second - 1) / time.Second)
	half := time.Duration(ttlSeconds) * time.Second / 2
	if opts.Window == 0 {
		opts.Window = half
	}
	if opts.Window < claim.WindowMin || opts.Window > half {
		return nil, fmt.Errorf("%w: window %s not in [%s, %s]", ErrConfig, opts.Window, claim.WindowMin, half)
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	grant, err := cli.Grant(ctx, ttlSeconds)
	if err != nil {
		return nil, fmt.Errorf("supervise: grant lease for node %s: %w", id, err)
	}
	now := normalize(time.Now())
	rec := NodeRecord{ID: id, Address: opts.Address, HTTP: opts.HTTP, Started: now, LastActive: now, Status: NodeReady, OutgoingMax: opts.OutgoingMax}
	val, err := encode(rec)
	if err != nil {
		return nil, err
	}
	resp, err := cli.Put(ctx, NodeKey(id), val, clientv3.WithLease(grant.ID), clientv3.WithPrevKV())
	if err != nil {
		revokeQuietly(ctx, cli, grant.ID)
		return nil, fmt.Errorf("supervise: register node %s: %w", id, err)
	}
	if resp.PrevKv != nil && resp.PrevKv.Lease != 0 {
		opts.Log.Info("supervise: node re-registered over an earlier incarnation", "node", id)
	}
	rec.Created, rec.ModRevision = resp.Header.Revision, resp.Header.Revision
	runCtx, cancel := context.WithCancelCause(context.Background())
	n := &Node{cli: cli, log: opts.Log, lease: grant.ID, window: opts.Window, key: NodeKey(id),
		ctx: runCtx, cancel: cancel, done: make(chan struct{}), rec: rec}
	ka, err := cli.KeepAlive(runCtx, grant.ID)
	if err != nil {
		cancel(err)
		close(n.done)
		revokeQuietly(ctx, cli, grant.ID)
		return nil, fmt.Errorf("supervise: keep node %s alive: %w", id, err)
	}
	go n.run(ka, now)
	return n, nil
}

// ID returns the node id.
func (n *Node) ID() string { return n.rec.ID }

// Lease returns the node's lease.
func (n *Node) Lease() clientv3.LeaseID { return n.lease }

// Context is cancelled when the registration is lost or closed; its cause
// (context.Cause) wraps ErrNodeLost, and ErrUnreachable when etcd was not
// reached for a window.
func (n *Node) Context() context.Context { return n.ctx }

// Done is Context().Done().
func (n *Node) Done() <-chan struct{} { return n.ctx.Done() }

// Err is nil while registered, then why the registration ended.
func (n *Node) Err() error { return context.Cause(n.ctx) }

// Hold puts c among the claims released when the node is lost or closed.
// A claim given after the loss is released at once.
func (n *Node) Hold(c *claim.Claim) error {
	n.mu.Lock()
	if n.ctx.Err() == nil {
		// Forget the claims that ended by themselves, so the list tracks
		// what is held now.
		kept := n.claims[:0]
		for _, h := range n.claims {
			if h.Err() == nil {
				kept = append(kept, h)
			}
		}
		n.claims = kept
		if len(n.claims) >= HeldClaimsMax {
			n.mu.Unlock()
			return fmt.Errorf("%w: more than %d claims held", ErrConfig, HeldClaimsMax)
		}
		n.claims = append(n.claims, c)
		n.mu.Unlock()
		return nil
	}
	n.mu.Unlock()
	n.releaseAll([]*claim.Claim{c})
	return n.Err()
}

// Close leaves the cluster cleanly: stops the activity updates, releases
// the held claims, deletes the record and revokes the lease. Safe after a
// loss and more than once.
func (n *Node) Close(ctx context.Context) error {
	n.cancel(fmt.Errorf("%w: closed", ErrNodeLost))
	<-n.done
	n.mu.Lock()
	held := n.claims
	n.claims = nil
	n.mu.Unlock()
	n.releaseAll(held)
	_, err := n.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(n.key), "=", n.rec.Created)).
		Then(clientv3.OpDelete(n.key)).
		Commit()
	revokeQuietly(ctx, n.cli, n.lease)
	if err != nil {
		return fmt.Errorf("supervise: deregister node %s: %w", n.rec.ID, err)
	}
	return nil
}

// lose ends the registration for cause and gives the work up.
func (n *Node) lose(cause error) {
	n.cancel(cause)
	n.log.Warn("supervise: node lost its registration; stopping its rejoin work", "node", n.rec.ID, "cause", context.Cause(n.ctx))
	n.mu.Lock()
	held := n.claims
	n.claims = nil
	n.mu.Unlock()
	n.releaseAll(held)
	if !errors.Is(cause, ErrUnreachable) {
		// Free the record at once; with etcd unreachable the revoke could
		// not be sent, and the lease expires by itself.
		revokeQuietly(context.Background(), n.cli, n.lease)
	}
}

// releaseAll gives the claims up. Release ends a claim's goroutines and
// closes its Lost before it talks to etcd, so work under it stops even if
// the delete cannot be sent; the lease then expires by itself.
func (n *Node) releaseAll(held []*claim.Claim) {
	if len(held) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), giveUpTimeout)
	defer cancel()
	for _, c := range held {
		if err := c.Release(ctx); err != nil {
			n.log.Info("supervise: claim left to expire", "task", c.Task().String(), "err", err)
		}
	}
}

// run is the node's driver: it drains the lease keepalive and updates the
// record's last activity ActivityChecksPerWindow times per window, until
// the registration ends.
//
// Invariant: lastOK is the send time of the latest update etcd applied (at
// first, the registration's), so the node was registered at lastOK; the
// next update is never scheduled past lastOK + window, and the node is
// declared lost by then unless an update succeeds.
func (n *Node) run(ka <-chan *clientv3.LeaseKeepAliveResponse, registered time.Time) {
	defer close(n.done)
	interval := n.window / ActivityChecksPerWindow
	timer := time.NewTimer(interval)
	defer timer.Stop()
	lastOK := registered
	for {
		select {
		case <-n.ctx.Done():
			return
		case _, ok := <-ka:
			if ok {
				continue
			}
			if n.ctx.Err() != nil {
				return // closed: the keepalive ended because we asked
			}
			n.lose(fmt.Errorf("%w: lease keepalive ended", ErrNodeLost))
			return
		case <-timer.C:
		}
		deadline := lastOK.Add(n.window)
		sent := time.Now()
		if !sent.Before(deadline) {
			n.lose(fmt.Errorf("%w: %w: no update since %s", ErrNodeLost, ErrUnreachable, lastOK.Format(time.RFC3339Nano)))
			return
		}
		rctx, cancel := context.WithDeadline(n.ctx, deadline)
		err := n.touch(rctx, sent)
		cancel()
		switch {
		case n.ctx.Err() != nil:
			return
		case errors.Is(err, ErrNodeLost):
			n.lose(err)
			return
		case err != nil && !time.Now().Before(deadline):
			n.lose(fmt.Errorf("%w: %w: %v", ErrNodeLost, ErrUnreachable, err))
			return
		case err == nil:
			lastOK = sent
		}
		timer.Reset(max(0, min(interval, time.Until(lastOK.Add(n.window)))))
	}
}

// touch writes the record with LastActive = now and status ready, only if
// the key is still this incarnation's, keeping its lease.
func (n *Node) touch(ctx context.Context, now time.Time) error {
	n.mu.Lock()
	rec := n.rec
	n.mu.Unlock()
	rec.LastActive, rec.Status = normalize(now), NodeReady
	val, err := encode(rec)
	if err != nil {
		return err
	}
	resp, err := n.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(n.key), "=", rec.Created)).
		Then(clientv3.OpPut(n.key, val, clientv3.WithIgnoreLease())).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: record of %s removed", ErrNodeLost, rec.ID)
	}
	n.mu.Lock()
	n.rec.LastActive, n.rec.ModRevision = rec.LastActive, resp.Header.Revision
	n.mu.Unlock()
	return nil
}

// revokeQuietly revokes a lease with a short bound even when ctx is done:
// the lease expires on its own anyway.
func revokeQuietly(ctx context.Context, cli *clientv3.Client, id clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveUpTimeout)
	defer cancel()
	_, _ = cli.Revoke(rctx, id)
}
