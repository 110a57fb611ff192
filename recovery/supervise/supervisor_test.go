package supervise

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
)

// executor plays one node's rejoin work: it claims and starts each task
// assigned to it (a new attempt per assignment seq), then declines it,
// completes it or holds it, as told.
type executor struct {
	node    string
	cli     *clientv3.Client
	decline bool // refuse every assignment
	hold    bool // claim and start, never complete

	mu       sync.Mutex
	handled  map[claim.Task]uint32 // seq last acted on
	attempts []claim.Attempt
	claims   []*claim.Claim
}

func newExecutor(node string, cli *clientv3.Client) *executor {
	return &executor{node: node, cli: cli, handled: map[claim.Task]uint32{}}
}

// run polls every 50 ms until ctx ends; steps are bounded by maxSteps.
func (x *executor) run(ctx context.Context, t *testing.T) {
	const maxSteps = 2000
	for range maxSteps {
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
		err := x.step(ctx)
		if x.cli.Ctx().Err() != nil {
			return // the node's client closed: the node is dead
		}
		if err != nil && ctx.Err() == nil {
			t.Logf("executor %s: %v", x.node, err)
		}
	}
}

func (x *executor) step(ctx context.Context) error {
	list, err := ListAssignments(ctx, x.cli, x.node)
	if err != nil {
		return err
	}
	for _, a := range list.Mine() {
		task := a.Task
		x.mu.Lock()
		seen := x.handled[task] >= a.Seq
		x.mu.Unlock()
		if a.Source != x.node {
			return fmt.Errorf("ListAssignments(%s) returned %+v", x.node, a)
		}
		if seen {
			continue
		}
		x.mu.Lock()
		x.handled[task] = a.Seq
		x.mu.Unlock()
		if x.decline {
			if err := Decline(ctx, x.cli, task, x.node, a.Seq); err != nil {
				return err
			}
			continue
		}
		c, err := claim.Acquire(ctx, x.cli, task, x.node+":attempt"+fmt.Sprint(a.Seq), 10*time.Second, claim.WithWindow(time.Second))
		if err != nil {
			return err
		}
		x.mu.Lock()
		x.attempts = append(x.attempts, c.Attempt())
		x.claims = append(x.claims, c)
		x.mu.Unlock()
		if _, err := claim.StartTask(ctx, x.cli, c.Attempt(), time.Now()); err != nil {
			return err
		}
		if x.hold {
			continue
		}
		if _, _, err := Complete(ctx, x.cli, c.Attempt(), time.Now(), nil); err != nil {
			return err
		}
		if err := c.Release(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (x *executor) releaseAll() {
	x.mu.Lock()
	defer x.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, c := range x.claims {
		_ = c.Release(ctx)
	}
}

// world is a test cluster: an etcd, nodes with their own clients, a
// placement, and tasks.
type world struct {
	t     *testing.T
	e     *claim.Embedded
	admin *clientv3.Client
	ctx   context.Context
	nodes map[string]*Node
	clis  map[string]*clientv3.Client
	wg    sync.WaitGroup
}

func newWorld(t *testing.T) *world {
	e := startEtcd(t)
	w := &world{t: t, e: e, admin: newClient(t, e), ctx: testCtx(t, 50*time.Second),
		nodes: map[string]*Node{}, clis: map[string]*clientv3.Client{}}
	t.Cleanup(w.wg.Wait)
	return w
}

// node registers id with a 2 s lease on a client of its own.
func (w *world) node(id string, outgoingMax int) *Node {
	cli := newClient(w.t, w.e)
	n, err := Register(w.ctx, cli, id, NodeOptions{TTL: 2 * time.Second, Window: 500 * time.Millisecond, OutgoingMax: outgoingMax, Log: testLog(w.t)})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})
	w.nodes[id], w.clis[id] = n, cli
	return n
}

func (w *world) replica(p uint32, node string, st recovery.ReplicaState) {
	if err := SetReplica(w.ctx, w.admin, Replica{Partition: p, Node: node, State: st}); err != nil {
		w.t.Fatal(err)
	}
}

// task opens the rejoin of partition p onto dest, registering dest first
// if needed: a rejoin task exists because its destination came back, and
// the supervisor ends the attempts of a dead destination.
func (w *world) task(p uint32, dest string) claim.Task {
	if w.nodes[dest] == nil {
		w.node(dest, 0)
	}
	task := claim.Task{Partition: p, Dest: dest}
	if _, err := claim.CreateTask(w.ctx, w.admin, task, time.Now()); err != nil {
		w.t.Fatal(err)
	}
	return task
}

// supervisor starts a supervisor on a client of its own and returns it
// with that client and a stop function (Run's cancel, waited for).
func (w *world) supervisor(id string, cfg Config) (*Supervisor, *clientv3.Client, func()) {
	return w.supervisorWith(id, cfg, newClient(w.t, w.e))
}

// supervisorWith runs a supervisor on cli, e.g. a client through a proxy.
func (w *world) supervisorWith(id string, cfg Config, cli *clientv3.Client) (*Supervisor, *clientv3.Client, func()) {
	cfg.NodeID, cfg.Log = id, testLog(w.t).With("sup", id)
	s, err := New(cli, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(done)
		// Run again after a lost session, a bounded number of times, as a
		// node's main loop would.
		for range 5 {
			if err := s.Run(ctx); ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return
			}
		}
	}()
	stop := func() { cancel(); <-done }
	w.t.Cleanup(stop)
	return s, cli, stop
}

func (w *world) executor(x *executor) {
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	go func() { defer close(done); x.run(ctx, w.t) }()
	w.t.Cleanup(func() { cancel(); <-done; x.releaseAll() })
}

func (w *world) assignment(task claim.Task) Assignment {
	a, _, err := GetAssignment(w.ctx, w.admin, task)
	if err != nil {
		w.t.Fatal(err)
	}
	return a
}

func (w *world) record(task claim.Task) claim.Record {
	r, err := claim.GetTask(w.ctx, w.admin, task)
	if err != nil {
		w.t.Fatal(err)
	}
	return r
}

var fastPasses = Config{SessionTTL: 2 * time.Second, PassEvery: 100 * time.Millisecond, HealthEvery: 500 * time.Millisecond,
	Limits: Limits{PassActionsMax: 16, ClaimWithin: 30 * time.Second}}

// TestSourceDiesReassigned: the source working a task dies (its client
// closes, its lease expires); the supervisor assigns the task to the other
// live replica as a new attempt, revoking the old claim, and the new
// attempt's epoch is higher. The dead attempt's late completion is a
// duplicate, ignored.
func TestSourceDiesReassigned(t *testing.T) {
	checkLeaks(t)
	w := newWorld(t)
	w.node("n1", 0)
	w.node("n2", 0)
	w.node("n3", 0)
	w.replica(1, "n1", recovery.ReplicaLive)
	w.replica(1, "n2", recovery.ReplicaLive)
	w.replica(1, "n3", recovery.ReplicaNeedsRejoin)
	task := w.task(1, "n3")
	x1 := newExecutor("n1", w.clis["n1"])
	x1.hold = true
	w.executor(x1)
	w.supervisor("sup", fastPasses)

	waitFor(t, 5*time.Second, "n1 to run the task", func() bool {
		r := w.record(task)
		return r.Status == claim.StatusRunning && w.assignment(task).Source == "n1"
	})
	first := w.record(task)
	x1.mu.Lock()
	old := x1.attempts[0]
	x1.mu.Unlock()

	// n1 dies: its client closes, so its node lease and its claim's lease
	// are no longer kept alive. n2's executor starts only now, so the task
	// cannot go to it before.
	killed := time.Now()
	w.clis["n1"].Close()
	x2 := newExecutor("n2", w.clis["n2"])
	w.executor(x2)
	waitFor(t, 8*time.Second, "the task reassigned to n2 and done", func() bool {
		return w.record(task).Status == claim.StatusDone
	})
	a := w.assignment(task)
	done := w.record(task)
	t.Logf("reassigned and done %s after n1 died (node lease TTL 2s)", time.Since(killed))
	if done.Executor != "n2:attempt2" || done.Epoch <= first.Epoch {
		t.Fatalf("done by %s at epoch %d; first attempt epoch %d", done.Executor, done.Epoch, first.Epoch)
	}
	if a.Seq != 0 && (a.Source != "n2" || a.Seq != 2 || a.Superseded != first.Epoch) {
		t.Fatalf("assignment %+v", a)
	}
	// The dead attempt's completion arrives late: ignored, record kept.
	rec, dup, err := Complete(w.ctx, w.admin, old, time.Now(), testLog(t))
	if err != nil || !dup || rec.Executor != "n2:attempt2" {
		t.Fatalf("late completion: %+v dup=%v err=%v", rec, dup, err)
	}
	// Once done, the assignment is removed.
	waitFor(t, 3*time.Second, "the assignment removed", func() bool {
		_, found, err := GetAssignment(w.ctx, w.admin, task)
		return err == nil && !found
	})
}

// TestDeclinedGoesElsewhere: a source that refuses its task (DESIGN.md step 9,
// too busy) gets it no more; the next live replica does it.
func TestDeclinedGoesElsewhere(t *testing.T) {
	checkLeaks(t)
	w := newWorld(t)
	w.node("n1", 0)
	w.node("n2", 0)
	w.replica(7, "n1", recovery.ReplicaLive)
	w.replica(7, "n2", recovery.ReplicaLive)
	task := w.task(7, "n3")
	x1 := newExecutor("n1", w.clis["n1"])
	x1.decline = true
	w.executor(x1)
	w.executor(newExecutor("n2", w.clis["n2"]))
	sup, _, _ := w.supervisor("sup", fastPasses)
	waitFor(t, 8*time.Second, "the task done", func() bool { return w.record(task).Status == claim.StatusDone })
	if r := w.record(task); r.Executor != "n2:attempt2" {
		t.Fatalf("done by %s", r.Executor)
	}
	if st := sup.Stats(); st.Assigned < 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestHealthTask (DESIGN.md step 10): a node keeping its lease but silent is marked
// not-responding, one silent for over a day is removed, and a running task
// whose claim is gone goes back to pending.
func TestHealthTask(t *testing.T) {
	checkLeaks(t)
	w := newWorld(t)
	cli := newClient(t, w.e)
	now := time.Now()
	// Records written by hand on a lease kept alive: a process alive to
	// etcd that does nothing else.
	lease, err := cli.Grant(w.ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	for id, last := range map[string]time.Time{"stuck": now.Add(-5 * time.Second), "ancient": now.Add(-25 * time.Hour)} {
		val, _ := encode(NodeRecord{Status: NodeReady, LastActive: last, Started: last})
		if _, err := cli.Put(w.ctx, NodeKey(id), val, clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}
	w.node("fresh", 0)
	task := w.task(3, "fresh")
	c, err := claim.Acquire(w.ctx, cli, task, "gone:1:x", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := claim.StartTask(w.ctx, cli, c.Attempt(), now); err != nil {
		t.Fatal(err)
	}
	_ = c.Release(w.ctx) // the claim goes, the record stays running: an interrupted task

	cfg := fastPasses
	cfg.Health = HealthLimits{NotRespondingAfter: 2 * time.Second, RemoveAfter: 24 * time.Hour, StaleAfter: 10 * time.Second}
	sup, _, _ := w.supervisor("sup", cfg)
	waitFor(t, 5*time.Second, "a health run", func() bool { return sup.Stats().HealthRuns >= 1 })
	nodes, err := Nodes(w.ctx, w.admin)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]NodeStatus{}
	for _, n := range nodes {
		got[n.ID] = n.Status
	}
	if len(got) != 2 || got["stuck"] != NodeNotResponding || got["fresh"] != NodeReady {
		t.Fatalf("nodes after health: %v", got)
	}
	if r := w.record(task); r.Status != claim.StatusPending || r.Note == "" {
		t.Fatalf("interrupted task: %+v", r)
	}
	t.Logf("stats %+v", sup.Stats())
}

// TestClaimLostReassigned: the attempt's claim disappears (expired, or
// deleted by the health task) while its source lives; the supervisor
// gives the task to the other replica as a new attempt with a higher
// epoch, and the first attempt's executor sees its claim lost.
func TestClaimLostReassigned(t *testing.T) {
	checkLeaks(t)
	w := newWorld(t)
	w.node("n1", 0)
	w.node("n2", 0)
	w.replica(5, "n1", recovery.ReplicaLive)
	w.replica(5, "n2", recovery.ReplicaLive)
	task := w.task(5, "n3")
	x1 := newExecutor("n1", w.clis["n1"])
	x1.hold = true
	w.executor(x1)
	w.supervisor("sup", fastPasses)
	waitFor(t, 5*time.Second, "n1 to run the task", func() bool { return w.record(task).Status == claim.StatusRunning })
	first := w.record(task)
	x1.mu.Lock()
	c1 := x1.claims[0]
	x1.mu.Unlock()

	lostAt := time.Now()
	if _, err := w.admin.Delete(w.ctx, task.ClaimKey()); err != nil {
		t.Fatal(err)
	}
	w.executor(newExecutor("n2", w.clis["n2"]))
	waitFor(t, 5*time.Second, "the task done by n2", func() bool { return w.record(task).Status == claim.StatusDone })
	t.Logf("claim lost -> done by the other source in %s", time.Since(lostAt))
	if r := w.record(task); r.Executor != "n2:attempt2" || r.Epoch <= first.Epoch {
		t.Fatalf("done %+v, first epoch %d", r, first.Epoch)
	}
	select {
	case <-c1.Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("first attempt's claim not lost")
	}
}

// TestDeposedWritesNothing: a supervisor whose election key is not (or no
// longer) the one it won with gets ErrNotLeader and writes nothing.
func TestDeposedWritesNothing(t *testing.T) {
	checkLeaks(t)
	w := newWorld(t)
	w.node("n1", 0)
	w.replica(2, "n1", recovery.ReplicaLive)
	task := w.task(2, "n3")
	s, err := New(w.admin, Config{NodeID: "old", Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	// The key a supervisor elected at revision 5 would hold, now gone.
	guard := clientv3.Compare(clientv3.CreateRevision(electionPrefix+"/gone"), "=", 5)
	err = s.pass(w.ctx, guard)
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("pass of a deposed supervisor: %v", err)
	}
	if _, found, err := GetAssignment(w.ctx, w.admin, task); err != nil || found {
		t.Fatalf("deposed supervisor wrote an assignment (found=%v, err=%v)", found, err)
	}
}

// TestDeadDestinationEndsAttempt: the destination's node dies while its
// rejoin runs; the supervisor ends the attempt (assignment and claim
// deleted, so the executor stops) and assigns nothing until the
// destination registers again, then the task is assigned anew.
func TestDeadDestinationEndsAttempt(t *testing.T) {
	checkLeaks(t)
	w := newWorld(t)
	w.node("n1", 0)
	w.replica(6, "n1", recovery.ReplicaLive)
	task := w.task(6, "n3")
	x1 := newExecutor("n1", w.clis["n1"])
	x1.hold = true
	w.executor(x1)
	w.supervisor("sup", fastPasses)
	waitFor(t, 5*time.Second, "n1 to run the task", func() bool { return w.record(task).Status == claim.StatusRunning })
	x1.mu.Lock()
	c1 := x1.claims[0]
	x1.mu.Unlock()

	if err := w.nodes["n3"].Close(w.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c1.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the attempt's claim outlived its destination")
	}
	waitFor(t, 5*time.Second, "the assignment deleted", func() bool {
		_, ok, err := GetAssignment(w.ctx, w.admin, task)
		return err == nil && !ok
	})
	// Nothing is assigned while the destination is dead.
	time.Sleep(500 * time.Millisecond)
	if _, ok, err := GetAssignment(w.ctx, w.admin, task); err != nil || ok {
		t.Fatalf("assigned with its destination dead: %v %v", ok, err)
	}
	delete(w.nodes, "n3")
	w.node("n3", 0)
	waitFor(t, 5*time.Second, "a new assignment once n3 is back", func() bool {
		_, ok, err := GetAssignment(w.ctx, w.admin, task)
		return err == nil && ok
	})
}
