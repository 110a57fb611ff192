package supervise

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
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
	// ActivityEvery caps the period of a registered node's activity
	// updates, whatever its window: its peers take a record that stays
	// unchanged for a few of them, beside a feed that ended, for a
	// process gone (docs/DESIGN.md "A kill found by its silence in
	// etcd"), and need the period to be one they know.
	ActivityEvery = 200 * time.Millisecond
	// HeldClaimsMax bounds the claims a node gives up on loss.
	HeldClaimsMax = 1024
	// giveUpTimeout bounds the releases and the lease revoke a lost node
	// attempts: etcd may be the reason it is lost, and the claims' and the
	// node's leases expire on their own.
	giveUpTimeout = time.Second
)

// ErrSuperseded: another incarnation of the node id (a newer process)
// registered over this one's record. The registration ends for good: two
// processes with one id would share an initiator id.
var ErrSuperseded = errors.New("supervise: record taken by another incarnation of the node")

// registerAttemptsMax bounds the create-or-replace rounds of one
// registration: each round either creates the record or deletes the one
// it found, so more rounds mean another writer races this one.
const registerAttemptsMax = 3

// NodeOptions configure Register.
type NodeOptions struct {
	Address string
	// HTTP is the node's admin HTTP address, stored in the record.
	HTTP string
	// TTL of the node's lease (whole seconds). Default NodeTTLDefault.
	TTL time.Duration
	// Window: a node that reached etcd with no activity update for a
	// window loses its term (DESIGN.md, "Without the coordinator"). Default and maximum TTL/2, so it
	// gives up its claims before its lease can expire and another node
	// take its work over; at least claim.WindowMin. A lost node tries to
	// register again every Window/ActivityChecksPerWindow.
	Window time.Duration
	// OutgoingMax is stored in the record (see NodeRecord).
	OutgoingMax int
	// ViewRev, if set, gives the record's ViewRev at each write.
	ViewRev func() int64
	// Started is the process's start, the record's Started: the one
	// incarnation the process shows everywhere (its feeds' hellos too).
	// Zero: the time of Register.
	Started time.Time
	// MayRegister, if set, is asked before each try to register again
	// after the term prev ended; an error is that try's failure (a
	// fenced process registers again only once it reaches a majority of
	// the live nodes: docs/DESIGN.md "Fencing by the peers' word").
	MayRegister func(ctx context.Context, prev *Term) error
	// ReportOnRegister, if set, gives the processes (node → its
	// NodeRecord.Started in Unix nanoseconds) this node reports in the
	// transaction that creates its record, on the same lease: those its
	// registration gate counted its report on (Gate.Report). Filed a
	// loop later, the cut's fence could pick on the reports already in,
	// with this node registered and its word not yet counted
	// (TestFencedNodeBackOnTheMajoritySide failed so under -race in CI).
	ReportOnRegister func() map[string]int64
	Log              *slog.Logger
}

// Node is this process's registration in the cluster, from Register to
// Close. It goes through terms (Term): a term is one unbroken
// registration, the record under NodeKey on a lease kept alive and an
// activity update every Window/ActivityChecksPerWindow. A term ends when
// its lease ends, its record is removed, or no update reaches etcd for a
// window; the claims given to Hold are then released (DESIGN.md, "Without the coordinator"), and the
// node keeps trying to register again until etcd answers, which starts
// the next term. Only Close, or another incarnation taking the record
// over (ErrSuperseded), ends the Node itself.
//
// Invariants: every record this process writes carries the same Started
// (the process's incarnation), so a newer process is told from a
// re-registration of this one; a term's record is the key with the
// term's CreateRevision, and every update compares it, so an update
// never lands on another incarnation's record.
type Node struct {
	cli        *clientv3.Client
	log        *slog.Logger
	id, key    string
	opts       NodeOptions
	ttlSeconds int64
	window     time.Duration
	started    time.Time

	life   context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when run has returned
	// lastOK (unix nanos) is the current term's keep loop's lastOK: the
	// node was registered then.
	lastOK atomic.Int64

	mu     sync.Mutex
	rec    NodeRecord // the current term's, as last written
	term   *Term
	next   chan struct{} // closed when term is replaced
	lapses int
	claims []*claim.Claim // held; released when the term ends
}

// Term is one unbroken registration of a Node. Its Context is cancelled,
// with the reason as its cause (wrapping ErrNodeLost, and ErrUnreachable
// when etcd was not reached for a window), when the term ends; the work
// that needs the registration (claims, rejoin tasks, supervision) derives
// from it.
type Term struct {
	// Seq numbers the node's terms from 1.
	Seq int
	// Lapses counts the node's registrations that lapsed before this
	// term began: each one's record was gone for a while (lease expired
	// or record removed), so other nodes may have taken the node for
	// dead then. A term that resumes the previous one's lease, which
	// outlived an outage, has the same count.
	Lapses int
	// Lease and Created are the term's lease and its record's
	// CreateRevision.
	Lease   clientv3.LeaseID
	Created int64

	ctx    context.Context
	cancel context.CancelCauseFunc
	// rev is the revision of the term's latest write etcd applied.
	rev    atomic.Int64
	ka     <-chan *clientv3.LeaseKeepAliveResponse
	stopKA context.CancelFunc
	// since is the send time of the write or read that showed the record
	// standing at the term's start.
	since time.Time
	// ended (Unix nanoseconds) is when the term was ended, 0 before.
	ended atomic.Int64
	// leaseSafe (Unix nanoseconds, 0: not known) is a time before which
	// etcd does not expire the term's lease (LeaseSafeUntil).
	leaseSafe atomic.Int64
}

// LeaseSafeUntil is a time before which etcd does not expire the term's
// lease, by the last keepalive of it that etcd answered: the send time of
// that keepalive plus the TTL it renewed the lease to (etcd counts the
// TTL from when it renews, after the send). Zero while none was answered
// yet. Until then no node takes this one for dead for a lapsed lease, so
// the nodes that wait for its replicas go on waiting for them, and a
// process that cannot reach etcd has missed nothing for that reason
// (recovery/node holds its replicas' results from then on, not from the
// term's end). Measured by this machine's clock against etcd's: a margin
// covers their rates' difference.
func (t *Term) LeaseSafeUntil() time.Time {
	if at := t.leaseSafe.Load(); at != 0 {
		return time.Unix(0, at)
	}
	return time.Time{}
}

// Ended is when the term ended; zero while it runs.
func (t *Term) Ended() time.Time {
	if at := t.ended.Load(); at != 0 {
		return time.Unix(0, at)
	}
	return time.Time{}
}

// Began is the send time of the write or read that showed the term's
// record standing at its start.
func (t *Term) Began() time.Time { return t.since }

// Context is cancelled when the term ends.
func (t *Term) Context() context.Context { return t.ctx }

// Done is Context().Done().
func (t *Term) Done() <-chan struct{} { return t.ctx.Done() }

// Err is nil while the term lasts, then why it ended.
func (t *Term) Err() error { return context.Cause(t.ctx) }

// Revision is the etcd revision of the term's latest record write (its
// creation, then each activity update): the node was registered then.
func (t *Term) Revision() int64 { return t.rev.Load() }

// Register registers node id and starts keeping it registered. A record
// left by an earlier incarnation of id, its lease alive or not, is
// replaced by a new one (a new CreateRevision), so the earlier one's
// updates fail.
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
	life, cancel := context.WithCancelCause(context.Background())
	n := &Node{cli: cli, log: opts.Log, id: id, key: NodeKey(id), opts: opts, ttlSeconds: ttlSeconds, window: opts.Window,
		started: normalize(cmp.Or(opts.Started, time.Now())), life: life, cancel: cancel, done: make(chan struct{}), next: make(chan struct{})}
	t, rec, err := n.register(ctx, false)
	if err != nil {
		cancel(err)
		return nil, err
	}
	n.term, n.rec = t, rec
	n.lastOK.Store(t.since.UnixNano())
	go n.run()
	return n, nil
}

// ID returns the node id.
func (n *Node) ID() string { return n.id }

// Lease returns the current term's lease.
func (n *Node) Lease() clientv3.LeaseID { return n.Term().Lease }

// Context is cancelled when the Node ends: Close, or another incarnation
// took the record over. Its cause wraps ErrNodeLost (and ErrSuperseded).
// A lost term does not end it: see Term.
func (n *Node) Context() context.Context { return n.life }

// Done is Context().Done().
func (n *Node) Done() <-chan struct{} { return n.life.Done() }

// Err is nil until the Node ends, then why.
func (n *Node) Err() error { return context.Cause(n.life) }

// Term returns the current term, or the last one, ended, while the node
// is not registered.
func (n *Node) Term() *Term {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.term
}

// Registered reports whether the current term lasts and an update
// reached etcd within the last window: a node stalled past its window
// (its process paused) is not registered from the moment it runs again,
// before its keep loop has noticed.
func (n *Node) Registered() bool {
	return n.Term().ctx.Err() == nil && time.Since(time.Unix(0, n.lastOK.Load())) < n.window
}

// NextTerm waits for a term after `after` and returns the current one
// (later terms may have begun and ended meanwhile: compare Lapses). It
// fails when ctx ends or the Node ends.
func (n *Node) NextTerm(ctx context.Context, after *Term) (*Term, error) {
	for {
		n.mu.Lock()
		t, next := n.term, n.next
		n.mu.Unlock()
		if t.Seq > after.Seq {
			return t, nil
		}
		select {
		case <-next:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-n.life.Done():
			return nil, n.Err()
		}
	}
}

// Hold puts c among the claims released when the current term ends. A
// claim given while the node is not registered is released at once.
func (n *Node) Hold(c *claim.Claim) error {
	n.mu.Lock()
	if n.term.ctx.Err() == nil {
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
	err := n.term.Err()
	n.mu.Unlock()
	n.releaseAll([]*claim.Claim{c})
	return err
}

// Abandon stops the activity updates and lease keepalives and leaves the
// record and the claims to their leases, as a process that crashed would:
// what tests of a node killed without a goodbye need in one process.
func (n *Node) Abandon() {
	n.cancel(fmt.Errorf("%w: abandoned", ErrNodeLost))
	<-n.done
}

// Close leaves the cluster cleanly: stops the activity updates, releases
// the held claims, deletes the record and revokes the lease. Safe after a
// loss and more than once.
func (n *Node) Close(ctx context.Context) error {
	n.cancel(fmt.Errorf("%w: closed", ErrNodeLost))
	<-n.done
	n.mu.Lock()
	held, created, lease := n.claims, n.rec.Created, n.term.Lease
	n.claims = nil
	n.mu.Unlock()
	n.releaseAll(held)
	_, err := n.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(n.key), "=", created)).
		Then(clientv3.OpDelete(n.key)).
		Commit()
	revokeQuietly(ctx, n.cli, lease)
	if err != nil {
		return fmt.Errorf("supervise: deregister node %s: %w", n.id, err)
	}
	return nil
}

// record is the node's record as this process writes it at now.
func (n *Node) record(now time.Time) NodeRecord {
	now = normalize(now)
	return NodeRecord{ID: n.id, Address: n.opts.Address, HTTP: n.opts.HTTP, Started: n.started, LastActive: now,
		Status: NodeReady, OutgoingMax: n.opts.OutgoingMax, ViewRev: n.viewRev()}
}

// viewRev is the record's ViewRev now.
func (n *Node) viewRev() int64 {
	if n.opts.ViewRev == nil {
		return 0
	}
	return n.opts.ViewRev()
}

// register writes a new record on a new lease and starts its keepalive.
// again: this process registered before, and a record of another
// incarnation means it was superseded.
func (n *Node) register(ctx context.Context, again bool) (*Term, NodeRecord, error) {
	granting := time.Now()
	grant, err := n.cli.Grant(ctx, n.ttlSeconds)
	if err != nil {
		return nil, NodeRecord{}, fmt.Errorf("supervise: grant lease for node %s: %w", n.id, err)
	}
	sent := time.Now()
	rec := n.record(sent)
	val, err := encode(rec)
	if err == nil {
		rec.Created, err = n.create(ctx, val, grant.ID, again)
	}
	if err != nil {
		revokeQuietly(ctx, n.cli, grant.ID)
		return nil, NodeRecord{}, err
	}
	rec.ModRevision = rec.Created
	t, err := n.newTerm(grant.ID, rec.Created, sent, again)
	if err != nil {
		revokeQuietly(ctx, n.cli, grant.ID)
		return nil, NodeRecord{}, err
	}
	if grant.TTL > 0 {
		t.leaseSafe.Store(granting.Add(time.Duration(grant.TTL) * time.Second).UnixNano())
	}
	return t, rec, nil
}

// create puts val under the node's key on lease as a new key and returns
// its CreateRevision. A key already there is deleted first (compared by
// its CreateRevision) unless it is another incarnation's and again is
// set: a Put over it would keep its CreateRevision, which the earlier
// incarnation's updates compare, and both would pass.
func (n *Node) create(ctx context.Context, val string, lease clientv3.LeaseID, again bool) (int64, error) {
	ops := []clientv3.Op{clientv3.OpPut(n.key, val, clientv3.WithLease(lease))}
	if n.opts.ReportOnRegister != nil {
		for suspect, inc := range n.opts.ReportOnRegister() {
			rv, err := encode(Report{Inc: inc})
			if err != nil {
				return 0, err
			}
			ops = append(ops, clientv3.OpPut(ReportKey(suspect, n.id), rv, clientv3.WithLease(lease)))
		}
	}
	for range registerAttemptsMax {
		resp, err := n.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(n.key), "=", 0)).
			Then(ops...).
			Else(clientv3.OpGet(n.key)).
			Commit()
		if err != nil {
			return 0, fmt.Errorf("supervise: register node %s: %w", n.id, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue // gone meanwhile
		}
		old, derr := decodeNode(kvs[0])
		switch {
		case derr == nil && !old.Started.Equal(n.started) && again:
			return 0, fmt.Errorf("%w: %w: node %s registered by a process started %s", ErrNodeLost, ErrSuperseded, n.id, old.Started.Format(time.RFC3339Nano))
		case derr == nil && !old.Started.Equal(n.started):
			n.log.Info("supervise: node re-registered over an earlier incarnation", "node", n.id, "earlier_started", old.Started)
		case derr != nil:
			n.log.Warn("supervise: replacing an unreadable node record", "node", n.id, "err", derr)
		}
		if _, err := n.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(n.key), "=", kvs[0].CreateRevision)).
			Then(clientv3.OpDelete(n.key)).
			Commit(); err != nil {
			return 0, fmt.Errorf("supervise: register node %s: replace the earlier record: %w", n.id, err)
		}
	}
	return 0, fmt.Errorf("supervise: register node %s: the record changed under %d attempts", n.id, registerAttemptsMax)
}

// newTerm starts the keepalive of lease and returns the next term.
func (n *Node) newTerm(lease clientv3.LeaseID, created int64, since time.Time, lapsed bool) (*Term, error) {
	kctx, stopKA := context.WithCancel(n.life)
	ka, err := n.cli.KeepAlive(kctx, lease)
	if err != nil {
		stopKA()
		return nil, fmt.Errorf("supervise: keep node %s alive: %w", n.id, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	seq := 1
	if n.term != nil {
		seq = n.term.Seq + 1
	}
	if lapsed {
		n.lapses++
	}
	ctx, cancel := context.WithCancelCause(n.life)
	t := &Term{Seq: seq, Lapses: n.lapses, Lease: lease, Created: created, ctx: ctx, cancel: cancel, ka: ka, stopKA: stopKA, since: since}
	t.rev.Store(created)
	return t, nil
}

// install makes t the current term.
func (n *Node) install(t *Term, rec NodeRecord) {
	n.lastOK.Store(t.since.UnixNano())
	n.mu.Lock()
	defer n.mu.Unlock()
	n.term, n.rec = t, rec
	close(n.next)
	n.next = make(chan struct{})
}

// run keeps the node registered, term after term, until the Node ends.
func (n *Node) run() {
	defer close(n.done)
	for {
		t := n.Term()
		cause := n.keep(t)
		if n.life.Err() != nil {
			cause = context.Cause(n.life)
		}
		n.endTerm(t, cause)
		if n.life.Err() != nil {
			return
		}
		if !n.reregister(t, cause) {
			return
		}
	}
}

// endTerm ends t for cause and gives its work up.
func (n *Node) endTerm(t *Term, cause error) {
	t.ended.Store(time.Now().UnixNano())
	t.cancel(cause)
	t.stopKA()
	n.mu.Lock()
	held := n.claims
	n.claims = nil
	n.mu.Unlock()
	n.releaseAll(held)
	if n.life.Err() != nil {
		return // closing: Close deregisters
	}
	n.log.Warn("supervise: node lost its registration; its rejoin work stops, its process stays and registers again", "node", n.id, "term", t.Seq, "cause", t.Err())
	if !errors.Is(cause, ErrUnreachable) {
		// The record is gone or another's: the lease holds nothing of
		// ours. With etcd unreachable it is kept, so that a term whose
		// lease outlives the outage resumes it.
		revokeQuietly(n.life, n.cli, t.Lease)
	}
}

// reregister registers the node again after prev ended, trying every
// Window/ActivityChecksPerWindow, each try bounded by a window, until it
// succeeds or the Node ends (Close, or ErrSuperseded). False: ended.
func (n *Node) reregister(prev *Term, cause error) bool {
	interval := n.window / ActivityChecksPerWindow
	var wait time.Duration
	if errors.Is(cause, ErrUnreachable) {
		wait = interval
	}
	started := time.Now()
	for tries := 1; ; tries++ {
		select {
		case <-time.After(wait):
		case <-n.life.Done():
			return false
		}
		wait = interval
		ctx, cancel := context.WithTimeout(n.life, n.window)
		var t *Term
		var rec NodeRecord
		err := error(nil)
		if n.opts.MayRegister != nil {
			err = n.opts.MayRegister(ctx, prev)
		}
		if err == nil {
			t, rec, err = n.reattach(ctx, prev)
		}
		cancel()
		switch {
		case err == nil:
			n.install(t, rec)
			n.log.Info("supervise: node registered again", "node", n.id, "term", t.Seq, "lapsed", t.Lapses > prev.Lapses,
				"tries", tries, "unregistered_for", time.Since(started).Round(time.Millisecond))
			return true
		case errors.Is(err, ErrSuperseded):
			n.log.Error("supervise: node superseded by another incarnation; it stops", "node", n.id, "err", err)
			n.cancel(err)
			return false
		case n.life.Err() != nil:
			return false
		case tries == 1 || tries%100 == 0:
			n.log.Info("supervise: registration not restored yet; retrying", "node", n.id, "tries", tries, "err", err)
		}
	}
}

// reattach starts the term after prev: it resumes prev's lease if the
// record still stands on it (the lease outlived the outage, so no node
// took this one for dead), and registers anew otherwise.
func (n *Node) reattach(ctx context.Context, prev *Term) (*Term, NodeRecord, error) {
	sent := time.Now()
	resp, err := n.cli.Get(ctx, n.key)
	if err != nil {
		return nil, NodeRecord{}, err
	}
	if len(resp.Kvs) == 1 {
		kv := resp.Kvs[0]
		rec, derr := decodeNode(kv)
		if derr == nil && !rec.Started.Equal(n.started) {
			return nil, NodeRecord{}, fmt.Errorf("%w: %w: node %s registered by a process started %s", ErrNodeLost, ErrSuperseded, n.id, rec.Started.Format(time.RFC3339Nano))
		}
		if derr == nil && kv.Lease == int64(prev.Lease) && kv.CreateRevision == prev.Created {
			t, err := n.newTerm(prev.Lease, prev.Created, sent, false)
			if err != nil {
				return nil, NodeRecord{}, err
			}
			t.leaseSafe.Store(prev.leaseSafe.Load()) // the same lease
			// The record stood on the lease at the read's revision: the
			// node was registered then. From its creation instead, a term
			// lost again before its first update named every process
			// registered since the node first did as registered during
			// the next outage, long dead ones that never fed it among
			// them, which cannot say what they sent: after two etcd pauses
			// in a row two nodes failed every replica of three partitions
			// (rejoin chaos --net-faults on --seed 1129202611, 10m).
			t.rev.Store(resp.Header.Revision)
			return t, rec, nil
		}
	}
	// The record no longer stands on prev's lease (a fence or the health
	// task removed it while etcd was out of reach, so the lease was kept
	// for a resume that cannot be). What else the node wrote on it, its
	// reports of silent nodes, goes now rather than at the lease's expiry:
	// a report filed before the fence must not count once the node is back
	// and hears the suspect. Not registering until it is gone keeps that
	// true when the revoke fails.
	if _, err := n.cli.Revoke(ctx, prev.Lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil, NodeRecord{}, fmt.Errorf("supervise: node %s: revoke the lease of its removed record: %w", n.id, err)
	}
	return n.register(ctx, true)
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

// keep is one term's driver: it drains the lease keepalive and updates the
// record's last activity ActivityChecksPerWindow times per window, or
// every ActivityEvery if that is sooner, until
// the term is lost (the cause is returned) or the Node ends (nil).
//
// Invariant: lastOK is the send time of the latest update etcd applied (at
// first, the term's start), so the node was registered at lastOK; the
// next update is never scheduled past lastOK + window, and the term is
// declared lost by then unless an update succeeds.
func (n *Node) keep(t *Term) error {
	interval := min(n.window/ActivityChecksPerWindow, ActivityEvery)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	lastOK := t.since
	n.lastOK.Store(lastOK.UnixNano())
	for {
		select {
		case <-n.life.Done():
			return nil
		case _, ok := <-t.ka:
			if ok {
				continue
			}
			if n.life.Err() != nil {
				return nil // closed: the keepalive ended because we asked
			}
			return fmt.Errorf("%w: lease keepalive ended", ErrNodeLost)
		case <-timer.C:
		}
		deadline := lastOK.Add(n.window)
		sent := time.Now()
		if !sent.Before(deadline) {
			return fmt.Errorf("%w: %w: no update since %s", ErrNodeLost, ErrUnreachable, lastOK.Format(time.RFC3339Nano))
		}
		rctx, cancel := context.WithDeadline(n.life, deadline)
		err := n.touch(rctx, sent)
		cancel()
		switch {
		case n.life.Err() != nil:
			return nil
		case errors.Is(err, ErrNodeLost):
			return err
		case err != nil && !time.Now().Before(deadline):
			return fmt.Errorf("%w: %w: %v", ErrNodeLost, ErrUnreachable, err)
		case err == nil:
			lastOK = sent
			n.lastOK.Store(lastOK.UnixNano())
			n.renew(t, lastOK.Add(n.window))
		}
		timer.Reset(max(0, min(interval, time.Until(lastOK.Add(n.window)))))
	}
}

// renew renews t's lease once, by deadline, and moves its LeaseSafeUntil
// on if etcd answered. The term's keepalive stream renews it too, but
// tells nothing of when each renewal was sent; one that fails here is
// left to that stream, and to keep's next round.
func (n *Node) renew(t *Term, deadline time.Time) {
	ctx, cancel := context.WithDeadline(n.life, deadline)
	defer cancel()
	sent := time.Now()
	resp, err := n.cli.KeepAliveOnce(ctx, t.Lease)
	if err != nil || resp.TTL <= 0 {
		return
	}
	if at := sent.Add(time.Duration(resp.TTL) * time.Second).UnixNano(); at > t.leaseSafe.Load() {
		t.leaseSafe.Store(at)
	}
}

// touch writes the record with LastActive = now and status ready, only if
// the key is still this term's, keeping its lease.
func (n *Node) touch(ctx context.Context, now time.Time) error {
	n.mu.Lock()
	rec := n.rec
	n.mu.Unlock()
	rec.LastActive, rec.Status, rec.ViewRev = normalize(now), NodeReady, n.viewRev()
	val, err := encode(rec)
	if err != nil {
		return err
	}
	resp, err := n.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(n.key), "=", rec.Created)).
		Then(clientv3.OpPut(n.key, val, clientv3.WithIgnoreLease())).
		Else(clientv3.OpGet(n.key)).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			if other, derr := decodeNode(kvs[0]); derr == nil && !other.Started.Equal(n.started) {
				return fmt.Errorf("%w: %w: node %s registered by a process started %s", ErrNodeLost, ErrSuperseded, rec.ID, other.Started.Format(time.RFC3339Nano))
			}
		}
		return fmt.Errorf("%w: record of %s removed", ErrNodeLost, rec.ID)
	}
	n.mu.Lock()
	n.rec.LastActive, n.rec.ViewRev, n.rec.ModRevision = rec.LastActive, rec.ViewRev, resp.Header.Revision
	n.term.rev.Store(resp.Header.Revision)
	n.mu.Unlock()
	return nil
}

// RegisteredBetween returns the node records created (a registration,
// first or again) at revisions in (after, upto], from etcd's history: the
// nodes that registered meanwhile, also those whose record is gone since.
// upto must be the revision of a node record write (a term's Created),
// which ends the read; the read is bounded by ctx. A history compacted
// past after is an error (etcd's ErrCompacted).
func RegisteredBetween(ctx context.Context, cli *clientv3.Client, after, upto int64) ([]NodeRecord, error) {
	if after >= upto {
		return nil, nil
	}
	ctx, cancel := context.WithCancel(ctx) // ends the watch
	defer cancel()
	var out []NodeRecord
	err := historyBetween(ctx, cli.Watch(ctx, nodesPrefix, clientv3.WithPrefix(), clientv3.WithRev(after+1)), "node registrations", after, upto,
		func(ev *clientv3.Event) error {
			kv := ev.Kv
			if ev.Type != clientv3.EventTypePut || kv.CreateRevision != kv.ModRevision {
				return nil
			}
			rec, err := decodeNode(kv)
			if err != nil {
				return err
			}
			out = append(out, rec)
			return nil
		})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ReplicasBetween reads etcd's history of the replica and node records
// once, from revision after to upto, and returns two views of it per
// partition. placed: the nodes whose replica record of the partition was
// created or deleted at revisions in (after, upto]; with the placements
// at after and at upto, every node that held a replica of it at some
// revision between. live: the nodes whose replica of it was live for the
// cluster at some revision in [after, upto], its record saying live while
// its node had a record, as a view at that revision counts it
// (recovery/node's placementOf), so an initiator may have answered a call
// on its result alone, each with the last such revision (LastLive);
// records written by one transaction are taken one event at a time,
// which can only add a node or raise its revision. upto must be the
// revision of a node record write (a term's Created), which ends the
// read; the read is bounded by ctx. A history compacted past after is an
// error (etcd's ErrCompacted).
func ReplicasBetween(ctx context.Context, cli *clientv3.Client, after, upto int64) (placed map[uint32][]string, live LastLive, err error) {
	placed, live = map[uint32][]string{}, LastLive{}
	registered := map[string]bool{}
	says := map[string]map[uint32]bool{} // per node, its replicas' records saying live
	liveNow := map[uint32]map[string]bool{}
	add := func(m map[uint32][]string, p uint32, node string) {
		if !slices.Contains(m[p], node) {
			m[p] = append(m[p], node)
		}
	}
	// note brings what is live in line with the records after the write
	// at rev: a replica live from rev was last live at rev so far, one no
	// longer live from rev was last live just before it.
	note := func(p uint32, node string, rev int64) {
		is, was := registered[node] && says[node][p], liveNow[p][node]
		if is == was {
			return
		}
		if liveNow[p] == nil {
			liveNow[p] = map[string]bool{}
		}
		liveNow[p][node] = is
		if !is {
			rev--
		}
		live.raise(p, node, rev)
	}
	setReplica := func(kv *mvccpb.KeyValue, deleted bool, rev int64) error {
		p, node, err := parseRecordKey(kv.Key, replicasPrefix)
		if err != nil {
			return err
		}
		is := false
		if !deleted {
			r, err := decodeReplica(kv)
			if err != nil {
				return err
			}
			is = r.State == recovery.ReplicaLive
		}
		if says[node] == nil {
			says[node] = map[uint32]bool{}
		}
		says[node][p] = is
		note(p, node, rev)
		return nil
	}
	setNode := func(key []byte, deleted bool, rev int64) {
		node := string(bytes.TrimPrefix(key, []byte(nodesPrefix)))
		registered[node] = !deleted
		for p := range says[node] {
			note(p, node, rev)
		}
	}
	nodes, _, err := rangeAt(ctx, cli, nodesPrefix, after)
	if err != nil {
		return nil, nil, err
	}
	for _, kv := range nodes {
		setNode(kv.Key, false, after)
	}
	reps, _, err := rangeAt(ctx, cli, replicasPrefix, after)
	if err != nil {
		return nil, nil, err
	}
	for _, kv := range reps {
		if err := setReplica(kv, false, after); err != nil {
			return nil, nil, err
		}
	}
	if after < upto {
		ctx, cancel := context.WithCancel(ctx) // ends the watch
		defer cancel()
		err = historyBetween(ctx, WatchMembership(ctx, cli, after), "replica records", after, upto,
			func(ev *clientv3.Event) error {
				kv, deleted := ev.Kv, ev.Type == clientv3.EventTypeDelete
				switch {
				case bytes.HasPrefix(kv.Key, []byte(nodesPrefix)):
					setNode(kv.Key, deleted, kv.ModRevision)
				case bytes.HasPrefix(kv.Key, []byte(replicasPrefix)):
					if deleted || kv.CreateRevision == kv.ModRevision {
						p, node, err := parseRecordKey(kv.Key, replicasPrefix)
						if err != nil {
							return err
						}
						add(placed, p, node)
					}
					return setReplica(kv, deleted, kv.ModRevision)
				}
				return nil
			})
		if err != nil {
			return nil, nil, err
		}
	}
	for p, nodes := range liveNow {
		for node, is := range nodes {
			if is {
				live.raise(p, node, upto)
			}
		}
	}
	return placed, live, nil
}

// LastLive holds, per partition and node, the last revision of a read of
// etcd's history (ReplicasBetween) at which the node's replica of the
// partition was live for the cluster.
type LastLive map[uint32]map[string]int64

func (l LastLive) raise(p uint32, node string, rev int64) {
	if l[p] == nil {
		l[p] = map[string]int64{}
	}
	if rev > l[p][node] {
		l[p][node] = rev
	}
}

// Since returns, per partition, the nodes, in order, whose replica was
// live at some revision of the read at or after rev.
func (l LastLive) Since(rev int64) map[uint32][]string {
	out := make(map[uint32][]string, len(l))
	for p, nodes := range l {
		for node, last := range nodes {
			if last >= rev {
				out[p] = append(out[p], node)
			}
		}
		slices.Sort(out[p])
	}
	return out
}

// historyBetween passes visit each event of wch, a watch from after+1
// on ctx, at revisions up to upto (after < upto), which must be the
// revision of an event wch sees; what names the read in its errors. The
// caller cancels ctx to end the watch once it returns.
func historyBetween(ctx context.Context, wch clientv3.WatchChan, what string, after, upto int64, visit func(*clientv3.Event) error) error {
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("supervise: %s after revision %d: %w", what, after, err)
		}
		for _, ev := range resp.Events {
			if ev.Kv.ModRevision > upto {
				return nil
			}
			if err := visit(ev); err != nil {
				return err
			}
			if ev.Kv.ModRevision == upto {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("supervise: %s after revision %d: %w", what, after, err)
	}
	return fmt.Errorf("supervise: %s after revision %d: watch ended", what, after)
}

// revokeQuietly revokes a lease with a short bound even when ctx is done:
// the lease expires on its own anyway.
func revokeQuietly(ctx context.Context, cli *clientv3.Client, id clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveUpTimeout)
	defer cancel()
	_, _ = cli.Revoke(rctx, id)
}
