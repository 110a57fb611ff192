package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/nodestate"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/txnid"
)

// Node is one running node process.
type Node struct {
	cfg Config
	id  string
	// calls is what a graceful stop waits on (stop.go): stopping refuses
	// new client calls; inCalls counts those sequenced and not answered;
	// lastCall is when the last one came, in Unix nanoseconds.
	stopping atomic.Bool
	inCalls  atomic.Int64
	lastCall atomic.Int64
	// goaway ends when a graceful stop has answered its calls: each
	// client connection stops reading, and says so (goAway);
	// clientConns counts the connections still open.
	// atOnce: the processes to report as soon as it is registered.
	atOnce      atOnce
	goaway      context.Context
	goawayNow   context.CancelFunc
	clientConns atomic.Int64
	// askStop stops the node as its context ending would (watchStop).
	askStop context.CancelFunc
	log     *slog.Logger
	// limited logs the conditions that repeat (see limitedLog).
	limited *limitedLog
	ctx     context.Context
	cli     *clientv3.Client
	reg     *supervise.Node
	store   *nodestate.Store
	cluster layout.Config
	schemas []partition.Schema
	procs   *partition.Registry
	// planted: the planted fault (Config.PlantDropKey) has fired.
	planted atomic.Bool
	started time.Time
	addrs   Addrs
	// serverTLS accepts connections; nil on an insecure node.
	serverTLS *tls.Config
	// slots are ConnsMax's, taken by connections past their hello.
	slots slots

	// replicas are the replicas the node hosts, by partition: a map
	// never written once stored, replaced whole when the placement gives
	// the node a replica or takes one away (reconcile.go), so the feed
	// reads it per txn with one atomic load and no lock. Read it by
	// hosted().
	replicas atomic.Pointer[map[uint32]*replica]
	members  members
	feeds    feedIns
	init     *initiator
	metrics  *metrics
	// timeline records the rejoins the node takes part in (timeline.go).
	timeline *timelines
	outgoing atomic.Int32
	// settledTerm is the registration term (Term.Seq) whose start found
	// nothing to settle or settled what the replicas may have missed while
	// the node was not registered (registration.go). No replica serves as
	// a rejoin source in a term that is not settled.
	settledTerm atomic.Int64
	// termLost is when the process last saw a registration term of its
	// end (Unix nanoseconds, 0: never): after it, it sequences nothing
	// until registered again (initiator.fenced).
	termLost atomic.Int64
	// retry hands the assignment loop the tasks whose attempt failed.
	retry chan claim.Task
	wg    sync.WaitGroup
	// waiting are the calls sequenced on goroutines of their own while
	// they wait for a feed (sequence): each ends by the node's end at the
	// latest.
	waiting sync.WaitGroup

	// applySlots holds a token per rejoin block being applied here as a
	// destination: at most cfg.ApplyMax at once.
	applySlots chan struct{}

	// opened are the partitions whose rejoin task this node opened and
	// that are not live yet: at most cfg.IncomingMax at once.
	openMu sync.Mutex
	opened map[uint32]bool

	// unpub are the replicas whose latest state change etcd did not take:
	// registration republishes them (registration.go).
	pubMu sync.Mutex
	unpub map[uint32]bool
}

// etcdReconnect paces the etcd client's tries to connect again: one a
// second at most, each given 3 s. gRPC's default backoff grows to two
// minutes between tries, and gives a try 20 s: after an etcd outage of
// 40 s a node registered again 31 s after etcd was back, and one cut
// from etcd for 28 s registered 19 s after the cut healed, while the
// cluster waited for it (TestRegistersSoonAfterALongEtcdOutage; rejoin
// chaos --duration 10m --seed 20261128). A try a second costs etcd
// nothing next to a node's keepalives.
var etcdReconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 3 * time.Second,
}

// etcdKeepAlive is the period of the etcd connection's keepalive pings
// and their timeout (etcd refuses pings more often than every 5 s).
const etcdKeepAlive = 10 * time.Second

// Run runs the node until ctx ends, or a newer process of its id takes
// its registration over (a lost registration does not end it: see
// registration.go). ready, if not nil, is called with the bound addresses
// once the node is registered. On return every goroutine of the node has
// ended and its durable record is closed (a clean shutdown).
func Run(ctx context.Context, cfg Config, ready func(Addrs)) (err error) {
	if err := cfg.defaults(); err != nil {
		return err
	}
	// A stop asked for through etcd (watchStop) ends the run as ctx would.
	ctx, askStop := context.WithCancel(ctx)
	defer askStop()
	n := &Node{askStop: askStop, cfg: cfg, id: NodeName(cfg.ID), started: time.Now(), opened: map[uint32]bool{}, unpub: map[uint32]bool{},
		applySlots: make(chan struct{}, cfg.ApplyMax), slots: slots{max: cfg.ConnsMax, clientsMax: cfg.ConnsMax - cfg.NodeConnsReserved}}
	n.goaway, n.goawayNow = context.WithCancel(context.Background())
	defer n.goawayNow()
	n.log = cfg.Log.With("node", n.id)
	n.limited = newLimitedLog(n.log, logEveryDefault)
	n.members.n, n.feeds.n = n, n
	if cfg.TLS != nil {
		n.serverTLS = cfg.TLS.ServerConfig()
		n.log.Info("mutual TLS", "identity", cfg.TLS.Identity().String(), "certificate_expires", cfg.TLS.NotAfter())
		if left := time.Until(cfg.TLS.NotAfter()); left < 30*24*time.Hour {
			n.log.Warn("the node's certificate expires soon: issue a new one (rejoin cert create-node) and restart", "in", left.Round(time.Hour))
		}
	} else {
		n.log.Warn("INSECURE: no TLS; anyone who reaches this node's port may call procedures, open feeds and rejoin streams, and read txns (--insecure)")
	}
	n.feeds.by = map[txnid.Initiator]*feedIn{}
	n.feeds.last = map[txnid.Initiator]*feedIn{}
	n.feeds.told = map[string]map[uint64][]toldHello{}
	// The keepalive ends a connection that went silent (a half-open TCP
	// connection): the membership watch on it then resumes on another.
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: etcdKeepAlive, DialKeepAliveTimeout: etcdKeepAlive,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(etcdReconnect)},
		TLS:         cfg.EtcdTLS, Username: cfg.EtcdUser, Password: cfg.EtcdPassword})
	if err != nil {
		return fmt.Errorf("node: etcd: %w", err)
	}
	defer cli.Close()
	n.cli = cli
	if n.cluster, err = waitCluster(ctx, cli, cfg.EtcdTimeout); err != nil {
		return n.stepErr(ctx, "read the cluster layout", err)
	}
	for _, t := range n.cluster.Tables {
		s, err := t.Schema()
		if err != nil {
			return err
		}
		n.schemas = append(n.schemas, s)
	}
	n.procs = partition.NewBuiltinRegistry()

	store, report, err := nodestate.Open(cfg.DataDir, n.id, n.started, n.log)
	if err != nil {
		return err
	}
	n.store = store
	defer func() {
		if cerr := store.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	// Before anything of this start reaches etcd (the incarnation, the
	// replica states): a live process of this id would be superseded.
	if !cfg.ReplaceRunning {
		wctx, cancel := context.WithTimeout(ctx, cfg.EtcdTimeout+supervise.NodeTTLMax)
		err := supervise.WaitNotRunning(wctx, cli, n.id, report.LastStart)
		cancel()
		if errors.Is(err, supervise.ErrProcessRunning) {
			return fmt.Errorf("node: %w; a second process with its id would take its place and it would stop: stop it first, or start this one with --replace-running to replace it", err)
		}
		if err != nil {
			return n.stepErr(ctx, "check that no process of this node runs", err)
		}
	}
	if err := n.startStep(ctx, "read the placement", func(ctx context.Context) error { return n.hostReplicas(ctx, report) }); err != nil {
		return err
	}

	ln, err := stream.Listen(cfg.Listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	if cfg.knobs.listener != nil {
		ln = cfg.knobs.listener(ln)
	}
	hln, err := net.Listen("tcp", cfg.HTTP)
	if err != nil {
		return fmt.Errorf("node: http listen: %w", err)
	}
	defer hln.Close()
	n.addrs = Addrs{Node: n.id, TCP: cfg.advertised(cfg.Listen, ln.Addr().String(), true),
		HTTP: cfg.advertised(cfg.HTTP, hln.Addr().String(), false)}
	// Off loopback the admin HTTP is TLS only, with the node's
	// certificate, and a scraper needs a certificate of the cluster's CA;
	// on loopback it serves plain HTTP too (adminServer).
	offLoopback := !isLoopback(hln.Addr()) || cfg.knobs.adminTLS
	if cfg.TLS != nil && offLoopback {
		n.addrs.HTTP = "https://" + n.addrs.HTTP
	} else if offLoopback {
		n.log.Warn("INSECURE: the admin HTTP is served in plain text off loopback", "http", n.addrs.HTTP)
	}

	if d := cfg.knobs.beforeRegister; d > 0 {
		time.Sleep(d)
	}
	// Registered, it is one every call of its partitions waits for: not
	// before it reaches its peers (reachPeers).
	if !cfg.knobs.noReachGate {
		if err := n.reachPeers(ctx); err != nil {
			return err
		}
	}
	var reg *supervise.Node
	if err := n.startStep(ctx, "register", func(ctx context.Context) (err error) {
		reg, err = supervise.Register(ctx, cli, n.id, supervise.NodeOptions{
			Address: n.addrs.TCP, HTTP: n.addrs.HTTP, TTL: cfg.NodeTTL, OutgoingMax: cfg.OutgoingMax, Started: n.started, Log: n.log,
			ViewRev: n.members.viewRev, MayRegister: n.mayRegister, ReportOnRegister: n.reportsOnRegistering,
		})
		return err
	}); err != nil {
		return err
	}
	n.reg = reg
	// The node runs until asked to stop, or until a newer incarnation of
	// its id takes its record over. A lost registration does not stop it
	// (docs/DESIGN.md "Without the coordinator"): only the work that needs
	// one does, term by term (registration).
	// Asked to stop, it first stops taking calls and answers those in
	// flight (drainCalls), so that its clients find none uncertain; a
	// registration taken over ends it at once.
	nctx, ncancel := context.WithCancel(context.WithoutCancel(ctx))
	defer ncancel()
	stopWatch := context.AfterFunc(reg.Context(), ncancel)
	defer stopWatch()
	drainWatch := context.AfterFunc(ctx, func() {
		if !n.cfg.knobs.crash {
			n.drainCalls(nctx)
		}
		ncancel()
	})
	defer drainWatch()
	n.ctx = nctx
	stop := newStopBound(n.log, cli)
	defer stop.end()
	defer func() {
		if n.cfg.knobs.crash {
			reg.Abandon()
			return
		}
		stop.deregister(reg)
	}()
	// Only now, registered, may the node count toward the cluster's
	// bootstrap (supervise.MarkRegistered).
	if err := n.startStep(ctx, "mark registered", func(ctx context.Context) error { return supervise.MarkRegistered(ctx, cli, n.id) }); err != nil {
		return err
	}
	if err := n.members.refresh(); err != nil {
		return err
	}
	if n.init, err = newInitiator(n); err != nil {
		return err
	}
	n.metrics = newMetrics(n)
	n.timeline = newTimelines(TimelineSamplesMax, TimelineRejoinsMax)

	srv, aln := n.adminServer(hln, offLoopback)
	srv.ErrorLog = slog.NewLogLogger(n.log.Handler(), slog.LevelWarn)
	n.goRun(func() { _ = srv.Serve(aln) })
	n.goRun(func() { n.accept(ln) })
	for _, r := range n.hosted() {
		n.goRun(r.loop)
	}
	n.members.onPlacement = n.reconcile
	n.goRun(n.members.run)
	n.goRun(n.init.run)
	n.retry = make(chan claim.Task, 64)
	n.goRun(n.holdAssignments)
	n.goRun(n.registration)
	n.goRun(n.fences)
	n.goRun(n.watchStop)
	n.goRun(func() { n.timeline.run(n.ctx, TimelineEvery, n.replicaStatuses) })
	n.log.Info("node ready", "tcp", n.addrs.TCP, "http", n.addrs.HTTP, "replicas", len(n.hosted()),
		"first_start", report.First, "unexpected_shutdown", report.Unexpected)
	if ready != nil {
		ready(n.addrs)
	}

	<-n.ctx.Done()
	stopErr := reg.Err()
	if ctx.Err() != nil {
		stopErr = nil // asked to stop
	}
	stop.begin()
	ln.Close()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	stop.step("the node's work: rejoin attempts reporting their end, claims released, replica states published, the supervisor resigning")
	n.wg.Wait()
	n.waiting.Wait()
	n.log.Info("node stopped", "err", stopErr)
	return stopErr
}

// isLoopback reports whether a listener's address is a loopback one.
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// incarnation tells this process's feeds from those of the node's earlier
// and later processes: its start time, which grows across restarts as
// long as the clock does not step back past a whole restart (a replica
// then refuses the new process's txns as out of order, and rejoins).
func (n *Node) incarnation() uint64 { return uint64(n.started.UnixNano()) }

// goRun runs f on a goroutine of the node's one group: Run returns only
// once every goroutine it started has ended. The group is a
// sync.WaitGroup, not an errgroup: none of them has an error to gather
// (each logs its own, or hands it to a core), and none's failure is to
// stop the others, which the node's context does.
func (n *Node) goRun(f func()) { n.wg.Go(f) }

// startStep runs one step of the node's start that waits on etcd, under
// its own deadline of cfg.EtcdTimeout, and names the step and the bound
// in its error.
func (n *Node) startStep(ctx context.Context, what string, step func(context.Context) error) error {
	sctx, cancel := context.WithTimeout(ctx, n.cfg.EtcdTimeout)
	defer cancel()
	if err := step(sctx); err != nil {
		return n.stepErr(ctx, what, err)
	}
	return nil
}

// stepErr names a failed start step, and the bound when it timed out.
func (n *Node) stepErr(ctx context.Context, what string, err error) error {
	if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("node: %s: etcd at %s did not answer within %s (--etcd-timeout): %w", what, strings.Join(n.cfg.Etcd, ","), n.cfg.EtcdTimeout, err)
	}
	if errors.Is(err, rpctypes.ErrPermissionDenied) || errors.Is(err, rpctypes.ErrUserNotFound) {
		// etcd says no more than that; what to do is ours to say.
		return fmt.Errorf("node: %s: %w: under etcd's authentication this node's certificate is etcd user %s, which needs the node role: an admin gives it with `rejoin access --node %d` (docs/DESIGN.md \"Who may write etcd\")",
			what, err, supervise.NodeUser(n.id), n.cfg.ID)
	}
	return fmt.Errorf("node: %s: %w", what, err)
}

// waitCluster waits for the cluster's config to be written: each read
// bounded by readTimeout, the whole by clusterWaitMax (etcd answers, but
// nobody initialised the cluster yet).
func waitCluster(ctx context.Context, cli *clientv3.Client, readTimeout time.Duration) (layout.Config, error) {
	deadline := time.Now().Add(clusterWaitMax)
	for {
		rctx, cancel := context.WithTimeout(ctx, readTimeout)
		c, err := layout.Read(rctx, cli)
		cancel()
		switch {
		case err == nil:
			return c, nil
		case !errors.Is(err, layout.ErrMissing):
			return c, err
		case time.Now().After(deadline):
			return c, fmt.Errorf("%w: none written in %s", err, clusterWaitMax)
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return c, ctx.Err()
		}
	}
}

// hostReplicas builds the replicas the placement gives this node. Until
// every node of the placement has started and registered once (the cluster is
// bootstrapped) no node takes a client call, so every copy is empty and a
// starting node's replicas are live; after that, whatever a replica held
// died with its process (DESIGN.md step 10): it needs a rejoin, which is recorded
// before the node registers, so no initiator waits for it. Which case
// this is, etcd says (supervise.Incarnate), never the data directory: a
// wiped or new directory on a node that ran before, or a node that starts
// for the first time after the others took writes, must not bring empty
// replicas up live (DESIGN.md "Incarnations and fencing").
func (n *Node) hostReplicas(ctx context.Context, report nodestate.StartReport) error {
	reps, err := supervise.Replicas(ctx, n.cli)
	if err != nil {
		return err
	}
	inc, err := supervise.Incarnate(ctx, n.cli, n.id, placedNodes(reps), n.started)
	if err != nil {
		return err
	}
	if report.First != inc.First() {
		n.log.Warn("the data directory and the cluster disagree on whether this node is new; the cluster decides",
			"empty_data_dir", report.First, "incarnation", inc.Count)
	}
	if inc.First() && !report.First {
		// The directory's epochs are another cluster's revisions.
		if err := n.store.ResetEpochs(); err != nil {
			return err
		}
	}
	// The states are written in batches, etcd's first: a node hosting
	// thousands of replicas writes them in a few round trips and one
	// sync, within --etcd-timeout.
	var rejoin []supervise.Replica
	var states []nodestate.Replica
	for _, rp := range reps {
		if rp.Node != n.id {
			continue
		}
		state := recovery.ReplicaLive
		if inc.Bootstrapped || rp.State != recovery.ReplicaLive {
			state = recovery.ReplicaNeedsRejoin
			rejoin = append(rejoin, supervise.Replica{Partition: rp.Partition, Node: n.id, State: recovery.ReplicaNeedsRejoin})
		}
		states = append(states, nodestate.Replica{Partition: rp.Partition, State: state})
	}
	if err := supervise.SetReplicas(ctx, n.cli, rejoin); err != nil {
		return err
	}
	if err := n.store.SetReplicas(states); err != nil {
		return err
	}
	placedAt := map[uint32]int64{}
	for _, rp := range reps {
		if rp.Node == n.id {
			placedAt[rp.Partition] = rp.Created
		}
	}
	hosted := make(map[uint32]*replica, len(states))
	for _, st := range states {
		r, err := newReplica(n, st.Partition, st.State == recovery.ReplicaLive)
		if err != nil {
			return err
		}
		// A move may have placed it here just before this process
		// started: its rejoin waits for every view to show it, as a
		// replica moved in while the node ran does (placedSeen).
		r.placedAt, r.created = placedAt[st.Partition], placedAt[st.Partition]
		hosted[st.Partition] = r
	}
	n.replicas.Store(&hosted)
	if len(hosted) == 0 {
		n.log.Warn("the placement gives this node no replica")
	}
	return nil
}

// placedNodes lists the nodes the placement gives a replica, once each.
func placedNodes(reps []supervise.Replica) []string {
	seen := map[string]bool{}
	var out []string
	for _, rp := range reps {
		if !seen[rp.Node] {
			seen[rp.Node] = true
			out = append(out, rp.Node)
		}
	}
	sort.Strings(out)
	return out
}

// replicaRejoining records an attempt's start (an interim state).
func (n *Node) replicaRejoining(p uint32, epoch uint64) {
	if err := n.store.SetReplica(nodestate.Replica{Partition: p, State: recovery.ReplicaRejoining, Epoch: epoch}); err != nil {
		n.log.Error("record replica state", "partition", p, "err", err)
	}
}

// replicaChanged records a replica going live, or needing a rejoin, in
// the node's record and in etcd (where initiators and the supervisor read
// it). It does not block the replica's goroutine, whose it is called on.
// It is written into r's own record only (r.created): the partition placed
// here again since is another replica. A held replica is needs-rejoin
// with its reason in etcd, and needs-rejoin in the node's record: a
// restart keeps none of its rows. Epoch is the destination attempt that
// made the replica live, 0 for a held one made live again.
func (n *Node) replicaChanged(r *replica, live bool, epoch uint64) {
	p, created, held := r.p, r.created, r.core.Held()
	state := recovery.ReplicaNeedsRejoin
	if live {
		state = recovery.ReplicaLive
	}
	if err := n.store.SetReplica(nodestate.Replica{Partition: p, State: state, Epoch: epoch}); err != nil {
		n.log.Error("record replica state", "partition", p, "err", err)
	}
	seq := r.pubSeq.Add(1)
	n.goRun(func() {
		r.pubMu.Lock()
		// A later change publishes, and only it.
		if r.pubSeq.Load() == seq {
			ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
			if err := supervise.UpdateReplica(ctx, n.cli, supervise.Replica{Partition: p, Node: n.id, State: state, Held: held, Created: created}); errors.Is(err, supervise.ErrNotPlaced) {
				n.log.Info("replica state not published: the placement no longer gives this node the partition", "partition", p)
				n.unpublished(p, false)
			} else if err != nil {
				n.log.Error("publish replica state", "partition", p, "err", err)
				n.unpublished(p, true)
			} else {
				n.unpublished(p, false)
			}
			cancel()
		}
		r.pubMu.Unlock()
		if live && epoch != 0 {
			// The destination completes the task too (DESIGN.md step 9: any
			// attempt's completion stands). It went live only with the
			// source's digest at E, which is what done means, so its word
			// is as good as the source's HandoffAck. A source that dies
			// after the handoff, or whose ack was lost and which requeues
			// the task, leaves no task open that would send new attempts
			// to a replica already live: whichever lands first, Requeue
			// then meets a done task (ErrTaskFinal), or Complete moves a
			// requeued one from pending to done.
			a := claim.Attempt{Task: claim.Task{Partition: p, Dest: n.id}, Executor: n.id + ":destination", Epoch: epoch}
			n.completeLive(a)
			n.openMu.Lock()
			delete(n.opened, p)
			n.openMu.Unlock()
		}
	})
}

// supervise campaigns for the supervisor's role, again after a lost
// session, until ctx (the registration's term) ends.
func (n *Node) supervise(ctx context.Context) {
	sup, err := supervise.New(n.cli, supervise.Config{NodeID: n.id, SessionTTL: n.cfg.NodeTTL, Log: n.log,
		Health: supervise.HealthLimits{StaleAfter: n.cfg.staleAfter()}})
	if err != nil {
		n.log.Error("supervisor", "err", err)
		return
	}
	for ctx.Err() == nil {
		if err := sup.Run(ctx); err != nil && ctx.Err() == nil {
			n.log.Info("supervisor run ended", "err", err)
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}
}

// Status is the node's current status.
func (n *Node) Status() Status {
	st := Status{Node: n.id, Addr: n.addrs.TCP, HTTP: n.addrs.HTTP, Started: n.started, TLS: n.serverTLS != nil, Insecure: n.serverTLS == nil}
	hosted := n.hosted()
	ps := make([]uint32, 0, len(hosted))
	for p := range hosted {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	settling := n.feeds.settling()
	for _, p := range ps {
		if rs := hosted[p].status.Load(); rs != nil {
			st.Replicas = append(st.Replicas, *rs)
			st.Replicas[len(st.Replicas)-1].Settling = settling
			st.TxnsExecuted += rs.TxnsExecuted
		}
	}
	return st
}
