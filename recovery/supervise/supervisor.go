package supervise

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// Defaults of a supervisor.
const (
	SessionTTLDefault  = 5 * time.Second
	PassEveryDefault   = 200 * time.Millisecond
	HealthEveryDefault = time.Second
	// PassActionsMaxDefault bounds the writes of one pass.
	PassActionsMaxDefault = 64
	// ClaimWithinDefault: an assigned source that has not claimed its task
	// after this long loses it to another source.
	ClaimWithinDefault = 10 * time.Second
	// resignTimeout bounds the resignation of a supervisor that stops: if
	// it cannot be sent, the session's lease expires within its TTL.
	resignTimeout = time.Second
)

// Config configures a Supervisor. Zero fields take the defaults above; the
// health limits default to 3 s not-responding, a day removal, 10 s stale.
type Config struct {
	// NodeID is this node's id, the election's value.
	NodeID string
	// SessionTTL is the election session's lease TTL (whole seconds): a
	// dead supervisor is replaced within about this long.
	SessionTTL time.Duration
	// PassEvery is the period of supervision passes; HealthEvery of the
	// health task.
	PassEvery, HealthEvery time.Duration
	// PassTimeout bounds one pass's reads and writes. Default PassEvery*10.
	PassTimeout time.Duration
	Limits      Limits
	Health      HealthLimits
	Log         *slog.Logger
	// Now is the driver's clock, the only one: the logic gets its reading.
	Now func() time.Time
}

// Stats count what a supervisor did, for tests and status output.
type Stats struct {
	Passes, Assigned, Unassigned, Lost int
	HealthRuns, MarkedNotResponding    int
	Removed, Reset                     int
}

// Supervisor runs the supervision of rejoin tasks when its node wins the
// election, one supervisor at a time (DESIGN.md step 9).
type Supervisor struct {
	cli *clientv3.Client
	cfg Config

	leading  atomic.Bool
	leader   atomic.Value // string: the leader last observed
	becameMu sync.Mutex
	became   chan struct{} // closed at the first win

	mu    sync.Mutex
	stats Stats
}

// New returns a supervisor for node cfg.NodeID; Run starts it.
func New(cli *clientv3.Client, cfg Config) (*Supervisor, error) {
	if err := checkID("node id", cfg.NodeID, nodeIDBytesMax); err != nil {
		return nil, err
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.SessionTTL, SessionTTLDefault)
	def(&cfg.PassEvery, PassEveryDefault)
	def(&cfg.HealthEvery, HealthEveryDefault)
	def(&cfg.PassTimeout, 10*cfg.PassEvery)
	def(&cfg.Limits.ClaimWithin, ClaimWithinDefault)
	def(&cfg.Health.NotRespondingAfter, 3*time.Second)
	def(&cfg.Health.RemoveAfter, 24*time.Hour)
	def(&cfg.Health.StaleAfter, 10*time.Second)
	if cfg.Limits.PassActionsMax == 0 {
		cfg.Limits.PassActionsMax = PassActionsMaxDefault
	}
	if cfg.SessionTTL < time.Second || cfg.SessionTTL > claim.TTLMax || cfg.PassEvery <= 0 ||
		cfg.HealthEvery <= 0 || cfg.PassTimeout <= 0 || cfg.Limits.PassActionsMax < 0 {
		return nil, fmt.Errorf("%w: %+v", ErrConfig, cfg)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Supervisor{cli: cli, cfg: cfg, became: make(chan struct{})}
	s.leader.Store("")
	return s, nil
}

// Leading reports whether this supervisor is the leader now.
func (s *Supervisor) Leading() bool { return s.leading.Load() }

// Became is closed when this supervisor first wins the election.
func (s *Supervisor) Became() <-chan struct{} { return s.became }

// Leader returns the leader's node id as last observed ("" if none yet).
func (s *Supervisor) Leader() string { return s.leader.Load().(string) }

// Stats returns a copy of the counters.
func (s *Supervisor) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Run campaigns for the supervisor role and, once elected, runs
// supervision passes every PassEvery and the health task every
// HealthEvery, until ctx ends (it resigns, so a successor takes over at
// once) or its session is lost (a successor takes over when the session's
// lease expires). It returns ctx's error or an error wrapping ErrNotLeader;
// the caller may Run again after the latter.
func (s *Supervisor) Run(ctx context.Context) error {
	ttl := int((s.cfg.SessionTTL + time.Second - 1) / time.Second)
	// A campaign that ctx ends resigns under its client's context
	// (concurrency.Election.Campaign), which has no deadline: with etcd
	// gone, a node stopping mid-campaign waited for it until the client
	// closed, which its node does only after this returns. The election's
	// client is s.cli's services under a context that ends resignTimeout
	// after ctx.
	ectx, ecancel := context.WithCancel(context.WithoutCancel(ctx))
	defer ecancel()
	stopBound := context.AfterFunc(ctx, func() { time.AfterFunc(resignTimeout, ecancel) })
	defer stopBound()
	ecli := clientv3.NewCtxClient(ectx)
	ecli.KV, ecli.Lease, ecli.Watcher = s.cli.KV, s.cli.Lease, s.cli.Watcher
	sess, err := concurrency.NewSession(ecli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("supervise: election session: %w", err)
	}
	defer func() {
		// Close would revoke under the already-cancelled ctx; revoke under
		// a bound of our own instead. A lost session's lease is gone anyway.
		sess.Orphan()
		revokeQuietly(ctx, s.cli, sess.Lease())
	}()
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	go func() {
		// Campaign does not notice its own key's lease expiring; the
		// session's Done does.
		defer wg.Done()
		select {
		case <-sess.Done():
			cancel()
		case <-runCtx.Done():
		}
	}()
	el := concurrency.NewElection(sess, electionPrefix)
	go func() {
		defer wg.Done()
		s.observe(runCtx, el)
	}()

	s.cfg.Log.Info("supervise: campaigning", "node", s.cfg.NodeID, "session_ttl", s.cfg.SessionTTL)
	if err := el.Campaign(runCtx, s.cfg.NodeID); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: campaign: %w", ErrNotLeader, err)
	}
	s.leading.Store(true)
	defer s.leading.Store(false)
	s.becameMu.Lock()
	select {
	case <-s.became:
	default:
		close(s.became)
	}
	s.becameMu.Unlock()
	s.cfg.Log.Info("supervise: elected supervisor", "node", s.cfg.NodeID, "rev", el.Rev())

	err = s.lead(runCtx, el)
	if ctx.Err() != nil {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), resignTimeout)
		defer rcancel()
		if rerr := el.Resign(rctx); rerr != nil {
			s.cfg.Log.Info("supervise: resign failed; session lease will expire", "err", rerr)
		}
		return ctx.Err()
	}
	return err
}

// observe keeps Leader up to date from the election's key, until ctx ends.
func (s *Supervisor) observe(ctx context.Context, el *concurrency.Election) {
	for resp := range el.Observe(ctx) {
		if len(resp.Kvs) > 0 {
			s.leader.Store(string(resp.Kvs[0].Value))
		}
	}
}

// lead is the leader's loop: a pass per PassEvery tick, a health run per
// HealthEvery tick. Each pass is bounded by PassActionsMax writes and
// PassTimeout; the loop ends with ctx (cancelled too when the session is
// lost).
func (s *Supervisor) lead(ctx context.Context, el *concurrency.Election) error {
	pass := time.NewTicker(s.cfg.PassEvery)
	defer pass.Stop()
	health := time.NewTicker(s.cfg.HealthEvery)
	defer health.Stop()
	guard := clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev())
	err := s.maybePass(ctx, guard)
	for !errors.Is(err, ErrNotLeader) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: session lost", ErrNotLeader)
		case <-pass.C:
			err = s.maybePass(ctx, guard)
		case <-health.C:
			err = s.maybeHealth(ctx, guard)
		}
	}
	// The election key is no longer ours although the session lives
	// (deleted by hand, or a lease mix-up): stop writing at once.
	return err
}

// maybePass runs one supervision pass. An error is logged and the next
// tick tries again; only a lost leadership is returned.
func (s *Supervisor) maybePass(ctx context.Context, guard clientv3.Cmp) error {
	pctx, cancel := context.WithTimeout(ctx, s.cfg.PassTimeout)
	defer cancel()
	err := s.pass(pctx, guard)
	return s.onErr(ctx, "pass", err)
}

// maybeHealth runs the health task, with maybePass's error handling.
func (s *Supervisor) maybeHealth(ctx context.Context, guard clientv3.Cmp) error {
	hctx, cancel := context.WithTimeout(ctx, s.cfg.PassTimeout)
	defer cancel()
	err := s.health(hctx, guard)
	return s.onErr(ctx, "health task", err)
}

func (s *Supervisor) onErr(ctx context.Context, what string, err error) error {
	switch {
	case err == nil || ctx.Err() != nil:
		return nil
	case errors.Is(err, ErrNotLeader):
		s.cfg.Log.Warn("supervise: lost the supervisor role", "during", what, "err", err)
		return err
	}
	s.cfg.Log.Warn("supervise: "+what+" failed", "err", err)
	return nil
}

// pass reads a snapshot, decides, and writes each action as a transaction
// guarded by the leadership (the election key still ours) and a
// compare-and-swap on the assignment.
func (s *Supervisor) pass(ctx context.Context, guard clientv3.Cmp) error {
	snap, err := readPassSnapshot(ctx, s.cli)
	if err != nil {
		return err
	}
	actions := Decide(snap, normalize(s.cfg.Now()), s.cfg.Limits)
	s.count(func(st *Stats) { st.Passes++ })
	for _, a := range actions {
		applied, err := s.apply(ctx, guard, a)
		if err != nil {
			return err
		}
		if !applied {
			s.count(func(st *Stats) { st.Lost++ })
			continue
		}
		switch a.Kind {
		case ActAssign:
			s.count(func(st *Stats) { st.Assigned++ })
			s.cfg.Log.Info("supervise: assigned", "task", a.Task.String(), "source", a.Assignment.Source,
				"seq", a.Assignment.Seq, "revoked_epoch", a.RevokeEpoch, "reason", a.Reason)
		case ActUnassign:
			s.count(func(st *Stats) { st.Unassigned++ })
		}
	}
	return nil
}

// apply writes one action; applied is false when a compare failed (the
// next pass sees the change). A lost leadership is ErrNotLeader.
func (s *Supervisor) apply(ctx context.Context, guard clientv3.Cmp, a Action) (applied bool, err error) {
	key := AssignmentKey(a.Task)
	var then []clientv3.Op
	switch a.Kind {
	case ActNoSource:
		s.cfg.Log.Debug("supervise: no source for task", "task", a.Task.String(), "reason", a.Reason)
		return true, nil
	case ActUnassign:
		then = []clientv3.Op{clientv3.OpDelete(key)}
	case ActAssign:
		val, err := encode(a.Assignment)
		if err != nil {
			return false, err
		}
		then = []clientv3.Op{clientv3.OpPut(key, val)}
	default:
		panic(fmt.Sprintf("supervise: unknown action %s", a.Kind))
	}
	if a.RevokeEpoch != 0 {
		// The claim of exactly that epoch goes with the write, so the
		// attempt it protected stops within a claim window.
		claimKey := a.Task.ClaimKey()
		then = append(then, clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(claimKey), "=", int64(a.RevokeEpoch))},
			[]clientv3.Op{clientv3.OpDelete(claimKey)}, nil))
	}
	resp, err := s.cli.Txn(ctx).If(guard).Then(clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", a.PrevModRevision)}, then, nil)).Commit()
	if err != nil {
		return false, fmt.Errorf("supervise: %s %s: %w", a.Kind, a.Task, err)
	}
	if !resp.Succeeded {
		return false, fmt.Errorf("%w: writing %s %s", ErrNotLeader, a.Kind, a.Task)
	}
	return resp.Responses[0].GetResponseTxn().Succeeded, nil
}

// health is the health task (DESIGN.md step 10), in its order: nodes silent too
// long are marked not-responding and those silent for RemoveAfter
// removed; then claim.ResetStale clears the claims of stale tasks and puts
// every running task no claim protects back to pending.
func (s *Supervisor) health(ctx context.Context, guard clientv3.Cmp) error {
	now := normalize(s.cfg.Now())
	nodes, err := Nodes(ctx, s.cli)
	if err != nil {
		return err
	}
	actions := CheckHealth(nodes, now, s.cfg.Health)
	for _, a := range actions {
		key := NodeKey(a.Node.ID)
		var op clientv3.Op
		if a.Kind == HealthRemove {
			op = clientv3.OpDelete(key)
		} else {
			rec := a.Node
			rec.Status = NodeNotResponding
			val, err := encode(rec)
			if err != nil {
				return err
			}
			op = clientv3.OpPut(key, val, clientv3.WithIgnoreLease())
		}
		resp, err := s.cli.Txn(ctx).If(guard).Then(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", a.Node.ModRevision)},
			[]clientv3.Op{op}, nil)).Commit()
		if err != nil {
			return fmt.Errorf("supervise: health %s: %w", a, err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("%w: health %s", ErrNotLeader, a)
		}
		if !resp.Responses[0].GetResponseTxn().Succeeded {
			continue // the node updated meanwhile: it is alive
		}
		s.cfg.Log.Info("supervise: health", "action", a.String())
		s.count(func(st *Stats) {
			if a.Kind == HealthRemove {
				st.Removed++
			} else {
				st.MarkedNotResponding++
			}
		})
	}
	resets, err := claim.ResetStale(ctx, s.cli, now, s.cfg.Health.StaleAfter, guard)
	for _, r := range resets {
		s.cfg.Log.Info("supervise: task reset", "task", r.Task.String(), "why", r.Why)
	}
	s.count(func(st *Stats) { st.HealthRuns++; st.Reset += len(resets) })
	switch {
	case errors.Is(err, claim.ErrFenced):
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	case err != nil && !errors.Is(err, context.Canceled):
		return err
	}
	return nil
}

func (s *Supervisor) count(f func(*Stats)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.stats)
}
