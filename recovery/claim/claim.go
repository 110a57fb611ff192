package claim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Limits of a claim's timing.
const (
	// TTLMax bounds a claim's lease TTL: a dead executor's task waits up to
	// a TTL before anyone else may claim it.
	TTLMax = time.Hour
	// WindowMin bounds the check window from below: each window costs
	// ChecksPerWindow linearizable reads per claim.
	WindowMin = 40 * time.Millisecond
	// ChecksPerWindow is how many times per window a claim re-reads its key.
	// With one check per window a loss just after a check would be seen a
	// whole window later plus the read's own time, past the promise of
	// Lost within one window; with four the key-change case is seen within
	// a quarter window plus one read.
	ChecksPerWindow = 4
	// releaseCleanupTimeout bounds the lease revoke Acquire does when it
	// could not create the key. The lease expires by itself after its TTL;
	// revoking it is only tidiness, not worth a long wait.
	releaseCleanupTimeout = time.Second
)

// Errors of claims, classified with errors.Is.
var (
	// ErrClaimed: Acquire found the task claimed by someone (maybe this
	// executor, under an earlier epoch). The error is a *ClaimedError.
	ErrClaimed = errors.New("claim: task already claimed")
	// ErrLost: the claim is no longer held. Err wraps it together with one
	// of the causes below.
	ErrLost = errors.New("claim: lost")
	// ErrSuperseded: the claim key holds another executor's claim (a
	// higher epoch): our lease expired and someone claimed after.
	ErrSuperseded = errors.New("claim: superseded")
	// ErrClaimGone: the claim key is gone: the lease expired, or the task
	// was reset or completed (those delete the claim key).
	ErrClaimGone = errors.New("claim: claim key gone")
	// ErrUnreachable: no check reached etcd for a whole window.
	ErrUnreachable = errors.New("claim: etcd unreachable for a window")
	// ErrKeepAliveEnded: the client stopped keeping the lease alive: etcd
	// reported it expired, gave no answer for a TTL, or the client closed.
	ErrKeepAliveEnded = errors.New("claim: lease keepalive ended")
	// ErrReleased: Release was called; Err returns it when the claim had
	// not been lost before.
	ErrReleased = errors.New("claim: released")
	// ErrConfig: a TTL or window out of range.
	ErrConfig = errors.New("claim: bad config")
)

// ClaimedError says who holds a task that Acquire could not claim.
type ClaimedError struct {
	Task   Task
	Holder string // executor id in the claim key
	Epoch  uint64 // the holder's fencing epoch
	// raced is true when the claim was free at the first read and the
	// create-if-absent transaction lost: tests count real races by it.
	raced bool
}

func (e *ClaimedError) Error() string {
	return fmt.Sprintf("claim: task %s already claimed by %s at epoch %d", e.Task, e.Holder, e.Epoch)
}

// Is makes errors.Is(err, ErrClaimed) true.
func (e *ClaimedError) Is(target error) bool { return target == ErrClaimed }

// Option tunes Acquire.
type Option func(*settings)

type settings struct {
	window time.Duration
}

// WithWindow sets the check window: the claim re-reads its key
// ChecksPerWindow times per window, and Lost closes at most one window after
// the claim stops being ours, including a window without reaching etcd.
// Default TTL/2; at most TTL/2 (see Acquire), at least WindowMin.
func WithWindow(d time.Duration) Option { return func(s *settings) { s.window = d } }

// Attempt identifies one attempt at a task: who works it and under which
// fencing epoch. Task records are written in its name.
type Attempt struct {
	Task     Task
	Executor string
	Epoch    uint64
}

// Claim is a held claim on a task: the claim key exists, carries our
// executor id and was created at revision Epoch, under our lease.
//
// A Claim owns two activities: the client's keepalive of its lease, and a
// goroutine that re-checks the key ChecksPerWindow times per window. Both
// end when the claim is lost or released, whichever comes first, and Lost
// closes then.
type Claim struct {
	cli     *clientv3.Client
	attempt Attempt
	key     string
	lease   clientv3.LeaseID
	ttl     time.Duration // as granted, which etcd may have raised
	window  time.Duration

	cancel context.CancelFunc // ends run and the keepalive
	done   chan struct{}      // closed when run has returned
	lost   chan struct{}      // closed once, when err is set

	// kaPaused is a test hook: the keepalive was stopped on purpose to play
	// an executor paused past its TTL, so its channel closing is not a loss.
	kaPaused atomic.Bool
	kaCancel context.CancelFunc
	// guard decides, from the answers of the checks and keepalives, when
	// to check, whether the claim is certainly held, when it is lost and
	// when the task record is due a touch (guard.go); its clock is Unix
	// nanoseconds. Guarded by gmu.
	gmu      sync.Mutex
	guard    *Guard
	stopOnce sync.Once
	mu       sync.Mutex
	err      error // why the claim ended; nil while held
}

// Acquire claims task for executorID under a fresh lease of ttl (rounded
// up to whole seconds; etcd may raise it to its minimum). The claim key is
// created in one transaction, only if absent (its CreateRevision is 0);
// if someone holds it, Acquire returns a *ClaimedError (errors.Is
// ErrClaimed).
//
// The epoch is the revision of that transaction, which is the key's
// CreateRevision. etcd's revision counter is cluster-wide, raft-replicated
// and persisted, and every write raises it by one, so it never repeats or
// goes back (compaction and restarts keep it). A later claim of the same
// task can only be created after this key is deleted (by Release, lease
// expiry, reset or completion), a write that itself raises the revision,
// so the later claim's epoch is strictly greater.
//
// The window must be at most half the TTL: an executor cut off from etcd
// then gives its claim up (Lost) before its lease can have expired and
// another executor claimed, as long as clocks run at similar rates. A
// process paused longer than that is caught by the epoch instead.
func Acquire(ctx context.Context, cli *clientv3.Client, task Task, executorID string, ttl time.Duration, opts ...Option) (*Claim, error) {
	if err := task.validate(); err != nil {
		return nil, err
	}
	if err := checkName("executor id", executorID, ExecutorBytesMax, ""); err != nil {
		return nil, err
	}
	if ttl <= 0 || ttl > TTLMax {
		return nil, fmt.Errorf("%w: ttl %s not in (0, %s]", ErrConfig, ttl, TTLMax)
	}
	ttlSeconds := int64((ttl + time.Second - 1) / time.Second) // etcd counts whole seconds
	s := settings{window: time.Duration(ttlSeconds) * time.Second / 2}
	for _, o := range opts {
		o(&s)
	}
	if s.window < WindowMin || s.window > time.Duration(ttlSeconds)*time.Second/2 {
		return nil, fmt.Errorf("%w: window %s not in [%s, ttl/2 = %s]", ErrConfig, s.window, WindowMin, time.Duration(ttlSeconds)*time.Second/2)
	}

	key := task.ClaimKey()
	// A read first: a held claim is the common answer to an executor that
	// polls, and a read costs no raft write where a lease grant and revoke
	// cost two. The transaction below still decides.
	held, err := cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("claim: read claim of %s: %w", task, err)
	}
	if len(held.Kvs) == 1 {
		kv := held.Kvs[0]
		return nil, &ClaimedError{Task: task, Holder: string(kv.Value), Epoch: uint64(kv.CreateRevision)}
	}
	grant, err := cli.Grant(ctx, ttlSeconds)
	if err != nil {
		return nil, fmt.Errorf("claim: grant lease for %s: %w", task, err)
	}
	sent := time.Now()
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, executorID, clientv3.WithLease(grant.ID))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil || !resp.Succeeded {
		// An error may hide a committed put; revoking the lease deletes the
		// key with it, so no claim is left behind that nobody keeps alive.
		revokeQuietly(ctx, cli, grant.ID)
		if err != nil {
			return nil, fmt.Errorf("claim: claim %s: %w", task, err)
		}
		ce := &ClaimedError{Task: task, raced: true}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			ce.Holder, ce.Epoch = string(kvs[0].Value), uint64(kvs[0].CreateRevision)
		}
		return nil, ce
	}

	g, err := NewGuard(GuardConfig{TTL: int64(time.Duration(grant.TTL) * time.Second), Window: int64(s.window)}, sent.UnixNano())
	if err != nil {
		revokeQuietly(ctx, cli, grant.ID)
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	kaCtx, kaCancel := context.WithCancel(runCtx)
	c := &Claim{
		guard:    g,
		cli:      cli,
		attempt:  Attempt{Task: task, Executor: executorID, Epoch: uint64(resp.Header.Revision)},
		key:      key,
		lease:    grant.ID,
		ttl:      time.Duration(grant.TTL) * time.Second,
		window:   s.window,
		cancel:   cancel,
		kaCancel: kaCancel,
		done:     make(chan struct{}),
		lost:     make(chan struct{}),
	}
	ka, err := cli.KeepAlive(kaCtx, grant.ID)
	if err != nil {
		close(c.done)
		_ = c.Release(ctx)
		return nil, fmt.Errorf("claim: keep lease of %s alive: %w", task, err)
	}
	go c.run(runCtx, ka)
	return c, nil
}

// Held is the lease guard: whether, at now, the claim is certainly still
// ours, so its holder may act. The check loop declares a loss within one
// window, but a process that was paused (a long GC, SIGSTOP, a frozen VM)
// wakes with the loop not yet run and could act for up to a window on a
// claim someone else already holds. A driver calls Held(time.Now()) before
// every message it sends and every state it makes durable, and stops when
// it is false.
//
// The rule is Guard.Held's: true until the earlier of a window after the
// latest check that found the key ours and half a TTL after the latest
// keepalive answer. The simulator (recovery/sim, LeaseGuard) runs the same
// guard and shows that without it a woken holder can write in the same
// tick as its successor.
func (c *Claim) Held(now time.Time) bool {
	select {
	case <-c.lost:
		return false
	default:
	}
	c.gmu.Lock()
	defer c.gmu.Unlock()
	return c.guard.Held(now.UnixNano())
}

// MaybeTouch reports whether the task record is due a touch at now, given
// the attempt's progress count, and if so takes it as touched: the
// attempt moved since the last touch and a window has passed since it
// (Guard.MaybeTouch). The caller then calls Touch.
func (c *Claim) MaybeTouch(now time.Time, progress uint64) bool {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	return c.guard.MaybeTouch(now.UnixNano(), progress)
}

// Attempt returns who holds the claim and under which epoch.
func (c *Claim) Attempt() Attempt { return c.attempt }

// Epoch returns the fencing epoch: put it in every rejoin message's header.
func (c *Claim) Epoch() uint64 { return c.attempt.Epoch }

// Task returns the claimed task.
func (c *Claim) Task() Task { return c.attempt.Task }

// TTL returns the lease TTL as granted.
func (c *Claim) TTL() time.Duration { return c.ttl }

// Window returns the check window.
func (c *Claim) Window() time.Duration { return c.window }

// Lost returns a channel closed when the claim stops being held: lost
// (see Err) or released. Work done under the claim selects on it and stops
// at once, writing nothing more.
func (c *Claim) Lost() <-chan struct{} { return c.lost }

// Err returns nil while the claim is held, then why it ended: an error
// wrapping ErrLost and its cause, or ErrReleased.
func (c *Claim) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Release stops the claim's goroutines, deletes the claim key if it is
// still ours (its CreateRevision is our epoch) and revokes our lease. A
// key someone else claimed since is left alone. Release is safe to call
// after a loss (it frees the task at once instead of after the TTL) and
// more than once; it returns an error only when etcd could not be told, in
// which case the lease still expires after its TTL.
func (c *Claim) Release(ctx context.Context) error {
	c.end(ErrReleased)
	<-c.done
	_, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(c.key), "=", int64(c.attempt.Epoch))).
		Then(clientv3.OpDelete(c.key)).
		Commit()
	if err != nil {
		return fmt.Errorf("claim: release %s: %w", c.attempt.Task, err)
	}
	// The lease carries only our key, so revoking it cannot touch another
	// claim. It may be gone already (expired, or revoked by an earlier call).
	if _, err := c.cli.Revoke(ctx, c.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("claim: revoke lease of %s: %w", c.attempt.Task, err)
	}
	return nil
}

// end records why the claim ended (the first reason wins), closes Lost and
// stops the keepalive and the check loop. It does not wait for the loop.
func (c *Claim) end(why error) {
	c.stopOnce.Do(func() {
		c.gmu.Lock()
		c.guard.end(why)
		c.gmu.Unlock()
		c.mu.Lock()
		c.err = why
		c.mu.Unlock()
		close(c.lost)
		c.cancel()
	})
}

// StopKeepAlive stops refreshing the lease while the checks go on, as a
// process stalled past its TTL would: fault injection, for tests and the
// demo's pause-holder. The claim is lost once the lease expires.
func (c *Claim) StopKeepAlive() {
	c.kaPaused.Store(true)
	c.kaCancel()
}

// run is the claim's driver: it drains the keepalive responses and sends
// the checks the guard asks for, with their answers back to it, until the
// claim ends. The guard decides the schedule (ChecksPerWindow a window,
// never past lastOK + window) and the loss, including a window without an
// answered check (ErrUnreachable).
func (c *Claim) run(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse) {
	defer close(c.done)
	timer := time.NewTimer(c.window / ChecksPerWindow)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ka:
			if ok {
				c.gmu.Lock()
				c.guard.OnKeepalive(time.Now().UnixNano(), true)
				c.gmu.Unlock()
				continue // a refresh; the checks decide a loss
			}
			if c.kaPaused.Load() {
				ka = nil // stopped by the test hook: checks find the loss
				continue
			}
			c.end(fmt.Errorf("%w: %w", ErrLost, ErrKeepAliveEnded))
			return
		case <-timer.C:
		}
		sent := time.Now()
		c.gmu.Lock()
		_, check := c.guard.Due(sent.UnixNano())
		lost, deadline := c.guard.Err(), time.Unix(0, c.guard.CheckDeadline())
		c.gmu.Unlock()
		if lost != nil {
			c.end(lost)
			return
		}
		if check {
			// The read may take until the deadline and no longer, so that
			// an unreachable etcd is noticed on time.
			rctx, cancel := context.WithDeadline(ctx, deadline)
			resp, err := c.cli.Get(rctx, c.key)
			cancel()
			if ctx.Err() != nil {
				return // released meanwhile
			}
			if err == nil {
				var kv *mvccpb.KeyValue
				if len(resp.Kvs) == 1 {
					kv = resp.Kvs[0]
				}
				err = checkHeld(kv, c.attempt, c.lease)
				c.gmu.Lock()
				c.guard.OnCheck(sent.UnixNano(), err)
				lost = c.guard.Err()
				c.gmu.Unlock()
				if lost != nil {
					c.end(lost)
					return
				}
			}
			// A failed read is retried at the next check while the window
			// lasts; past it the guard counts the claim lost.
		}
		c.gmu.Lock()
		next := time.Unix(0, c.guard.NextCheck())
		c.gmu.Unlock()
		timer.Reset(max(0, time.Until(next)))
	}
}

// checkHeld is the rule of a check: the claim is ours while the key exists,
// was created at our epoch, names us and sits on our lease.
func checkHeld(kv *mvccpb.KeyValue, a Attempt, lease clientv3.LeaseID) error {
	switch {
	case kv == nil:
		return ErrClaimGone
	case uint64(kv.CreateRevision) != a.Epoch:
		return fmt.Errorf("%w: %s holds it at epoch %d, ours was %d", ErrSuperseded, kv.Value, kv.CreateRevision, a.Epoch)
	case string(kv.Value) != a.Executor || clientv3.LeaseID(kv.Lease) != lease:
		// Same create revision means the same put, so this cannot happen
		// unless someone rewrote the key by hand.
		return fmt.Errorf("%w: key rewritten to %q on lease %x", ErrSuperseded, kv.Value, kv.Lease)
	}
	return nil
}

// revokeQuietly revokes a lease Acquire no longer needs, with a short
// bound even when ctx is already done: the lease expires on its own anyway.
func revokeQuietly(ctx context.Context, cli *clientv3.Client, id clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseCleanupTimeout)
	defer cancel()
	_, _ = cli.Revoke(rctx, id)
}
