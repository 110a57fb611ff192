package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// Node ids of the simulated cluster: the source node (a live replica of
// the partition) and the destination node (its replica needs the rejoin).
const (
	srcNode = "src"
	dstNode = "dst"
)

// simTask is the run's one rejoin task: the partition onto the
// destination node.
var simTask = claim.Task{Partition: partitionID, Dest: dstNode}

// tickDuration maps the simulator's ticks to the durations the product's
// rules are written in (records' times, Decide's and the health task's
// limits): one millisecond, as the initiators' clocks read.
const tickDuration = time.Millisecond

// timeAt is the wall time the product's rules see at tick.
func timeAt(tick uint64) time.Time {
	return time.UnixMilli(baseMillis).UTC().Add(time.Duration(tick) * tickDuration)
}

// errCoordDown: the coordinator did not answer (an outage); the request
// may be retried.
var errCoordDown = errors.New("sim: coordinator unreachable")

// coordinator is the simulated etcd (DESIGN.md steps 1, 9 and 10), reduced
// to what one task needs: the task's claim key and its lease, the task's
// record (a claim.Record, moved by claim's own record rules), the task's
// assignment (a supervise.Assignment), the nodes' registrations and the
// partition's placement, and a cluster-wide revision that every write
// raises by one, as etcd's does. It can be down (an outage): it then
// answers nothing, and nothing in it moves, leases included.
//
// Invariants:
//   - at most one claim key exists, created only if absent (acquire), so
//     at most one holder holds the task at a time in the coordinator's
//     view, whatever the holders believe;
//   - the epoch of a claim is the revision that created its key, and a key
//     is created only after the previous one's deletion (a write), so the
//     epochs of successive claims strictly grow;
//   - a lease is its claim's own; a keepalive extends it and writes
//     nothing; a lease not kept alive for TTL ticks expires and deletes
//     its key (a write), and etcd's leases outlive an outage (on recovery
//     each gets a whole TTL again, as an etcd leader's do);
//   - the record moves only by claim's rules (StartRecord, TouchRecord,
//     RequeueRecord, DoneRecord, ResetRecord), each write in the name of
//     the claim's holder where the product compares the claim key; a done
//     record stays done;
//   - the assignment is written only with a compare-and-swap on its
//     revision (ModRevision).
type coordinator struct {
	rev   uint64
	claim *claimKey // nil: no claim
	// leases: the claims' leases by epoch (a lease outlives its key when
	// the key is deleted by a reset or a revoke), with when each runs out.
	leases map[uint64]uint64
	task   claim.TaskRecord
	assign *supervise.Assignment // nil: none
	nodes  map[string]supervise.NodeRecord
	// order: the node ids, sources then the destination.
	order []string
	// replicas: the placement of the partition, sources then destination.
	replicas []supervise.Replica
	// nodeGoneAt: when the record of a node that died goes (its lease runs
	// out), by id.
	nodeGoneAt map[string]uint64
	// downUntil: the coordinator answers nothing while tick < downUntil.
	downUntil uint64
	// cutOff: a node whose requests do not reach the coordinator (nor its
	// answers the node) while tick < cutOff[node]; the coordinator runs on
	// for the others.
	cutOff map[string]uint64
	// claims counts claims made (the record's Attempts counts starts).
	claims int
	// history: the registrations made since the start (etcd's history
	// of the node records, as supervise.RegisteredBetween reads it): a
	// lost registration's new record and the joiner's (registration.go).
	history []registration
}

// claimKey is the task's claim: who holds it (the executor id, whose node
// part names the source node, as supervise.ExecutorID's does) and its
// epoch.
type claimKey struct {
	holder string
	node   string
	epoch  uint64 // the revision that created the key; its lease's id
}

// newCoordinator opens the task (claim.CreateTask: pending, attempts 0)
// and registers the nodes and the placement, at tick.
func newCoordinator(tick uint64, srcs []*srcReplica) coordinator {
	c := coordinator{leases: map[uint64]uint64{}, nodes: map[string]supervise.NodeRecord{}}
	now := timeAt(tick)
	for _, sr := range srcs {
		c.order = append(c.order, sr.id)
		c.replicas = append(c.replicas, supervise.Replica{Partition: partitionID, Node: sr.id, State: recovery.ReplicaLive})
	}
	c.order = append(c.order, dstNode)
	c.replicas = append(c.replicas, supervise.Replica{Partition: partitionID, Node: dstNode, State: recovery.ReplicaNeedsRejoin})
	for _, id := range c.order {
		c.nodes[id] = supervise.NodeRecord{ID: id, Address: id, Started: now, LastActive: now, Status: supervise.NodeReady, Created: int64(c.write())}
	}
	c.write()
	rev := c.write()
	c.task = claim.TaskRecord{Task: simTask, Record: claim.Record{Status: claim.StatusPending, UpdatedAt: now, Opened: rev, ModRevision: int64(rev)}}
	return c
}

// write raises the revision: one write in the coordinator.
func (c *coordinator) write() uint64 {
	c.rev++
	return c.rev
}

func (c *coordinator) down(tick uint64) bool { return tick < c.downUntil }

// unreachable reports whether node cannot reach the coordinator at tick:
// it is down, or the node is cut off from it.
func (c *coordinator) unreachable(tick uint64, node string) bool {
	return c.down(tick) || tick < c.cutOff[node]
}

// cut cuts node off from the coordinator for n ticks from tick.
func (c *coordinator) cut(tick, n uint64, node string) {
	if c.cutOff == nil {
		c.cutOff = map[string]uint64{}
	}
	c.cutOff[node] = max(c.cutOff[node], tick+n)
}

// outage makes the coordinator answer nothing for n ticks from tick.
func (c *coordinator) outage(tick, n uint64) { c.downUntil = max(c.downUntil, tick+n) }

// step is the coordinator's tick: at the end of an outage every lease gets
// a whole TTL again; then leases run out and delete their keys. It returns
// the epoch of a claim key deleted by its lease's expiry.
func (c *coordinator) step(tick, ttl uint64) (uint64, bool) {
	if c.down(tick) {
		return 0, false
	}
	if c.downUntil != 0 && tick == c.downUntil {
		for e := range c.leases {
			c.leases[e] = max(c.leases[e], tick+ttl)
		}
		for id := range c.nodeGoneAt {
			c.nodeGoneAt[id] = max(c.nodeGoneAt[id], tick+ttl)
		}
	}
	for id, at := range c.nodeGoneAt {
		if tick >= at {
			// The dead node's registration lease ran out: its record goes.
			delete(c.nodeGoneAt, id)
			delete(c.nodes, id)
			c.write()
		}
	}
	var expired uint64
	found := false
	for e, at := range c.leases {
		if tick < at {
			continue
		}
		delete(c.leases, e)
		if c.claim != nil && c.claim.epoch == e {
			c.claim = nil
			c.write()
			expired, found = e, true
		}
	}
	return expired, found
}

// acquire creates the claim key for holder if there is none, under a
// fresh lease (claim.Acquire), and returns its epoch.
func (c *coordinator) acquire(tick, ttl uint64, holder, node string) (uint64, error) {
	if c.down(tick) {
		return 0, errCoordDown
	}
	if c.claim != nil {
		return 0, fmt.Errorf("%w: by %s at epoch %d", claim.ErrClaimed, c.claim.holder, c.claim.epoch)
	}
	e := c.write()
	c.claim = &claimKey{holder: holder, node: node, epoch: e}
	c.leases[e] = tick + ttl
	c.claims++
	return e, nil
}

// holds reports whether the claim of epoch is the task's claim now.
func (c *coordinator) holds(epoch uint64) bool { return c.claim != nil && c.claim.epoch == epoch }

// check is a holder's read of the claim key (Claim's check loop): nil if
// the key is still its own, else why not (claim.ErrClaimGone,
// claim.ErrSuperseded), or errCoordDown.
func (c *coordinator) check(tick, epoch uint64) error {
	switch {
	case c.down(tick):
		return errCoordDown
	case c.claim == nil:
		return claim.ErrClaimGone
	case c.claim.epoch != epoch:
		return fmt.Errorf("%w: epoch %d holds it", claim.ErrSuperseded, c.claim.epoch)
	}
	return nil
}

// keepalive extends the lease of epoch's claim; alive is false when the
// lease is gone. ok is false when the coordinator did not answer.
func (c *coordinator) keepalive(tick, epoch, ttl uint64) (alive, ok bool) {
	if c.down(tick) {
		return false, false
	}
	if _, found := c.leases[epoch]; !found {
		return false, true
	}
	c.leases[epoch] = tick + ttl
	return true, true
}

// release deletes the claim key if it is still epoch's, and revokes its
// lease (Claim.Release). It reports whether a key was deleted.
func (c *coordinator) release(tick, epoch uint64) (bool, error) {
	if c.down(tick) {
		return false, errCoordDown
	}
	delete(c.leases, epoch)
	if !c.holds(epoch) {
		return false, nil
	}
	c.claim = nil
	c.write()
	return true, nil
}

// asHolder runs f on the record in a's name, as claim's updateAsHolder
// does: the write compares the claim key (a's epoch and executor).
func (c *coordinator) asHolder(tick uint64, a claim.Attempt, f func(claim.Record) (claim.Record, bool, error)) (claim.Record, error) {
	if c.down(tick) {
		return claim.Record{}, errCoordDown
	}
	if c.claim == nil || c.claim.epoch != a.Epoch || c.claim.holder != a.Executor {
		return c.task.Record, fmt.Errorf("%w: claim of %s at epoch %d is no longer %s's", claim.ErrNotHolder, a.Task, a.Epoch, a.Executor)
	}
	next, write, err := f(c.task.Record)
	if err != nil || !write {
		return next, err
	}
	next.ModRevision = int64(c.write())
	c.task.Record = next
	return next, nil
}

// startTask is claim.StartTask on the model.
func (c *coordinator) startTask(tick uint64, a claim.Attempt) (claim.Record, error) {
	return c.asHolder(tick, a, func(r claim.Record) (claim.Record, bool, error) {
		return claim.StartRecord(r, a, timeAt(tick))
	})
}

// touch is claim.Touch on the model.
func (c *coordinator) touch(tick uint64, a claim.Attempt) (claim.Record, error) {
	return c.asHolder(tick, a, func(r claim.Record) (claim.Record, bool, error) {
		r, err := claim.TouchRecord(r, a, timeAt(tick))
		return r, err == nil, err
	})
}

// requeue is claim.Requeue on the model.
func (c *coordinator) requeue(tick uint64, a claim.Attempt, note string) (claim.Record, error) {
	return c.asHolder(tick, a, func(r claim.Record) (claim.Record, bool, error) {
		r, err := claim.RequeueRecord(r, a, note, timeAt(tick))
		return r, err == nil, err
	})
}

// complete is claim.MarkDone on the model (supervise.Complete): any
// attempt of the generation completes the task, a second completion is
// claim.ErrDuplicate, and a claim of another epoch is deleted with it.
func (c *coordinator) complete(tick uint64, a claim.Attempt) (claim.Record, error) {
	if c.down(tick) {
		return claim.Record{}, errCoordDown
	}
	next, err := claim.DoneRecord(c.task.Record, a, timeAt(tick))
	if err != nil {
		return next, err
	}
	next.ModRevision = int64(c.write())
	c.task.Record = next
	if c.claim != nil && c.claim.epoch != a.Epoch {
		c.claim = nil // in the same transaction: no write of its own
	}
	// The destination's replica is live: the placement says so.
	c.replicas[len(c.replicas)-1].State = recovery.ReplicaLive
	return next, nil
}

// holderOf is supervise.ClaimHolder on the model: who holds the claim.
func (c *coordinator) holderOf(tick uint64) (supervise.Holder, bool, error) {
	if c.down(tick) {
		return supervise.Holder{}, false, errCoordDown
	}
	if c.claim == nil {
		return supervise.Holder{}, false, nil
	}
	return supervise.Holder{Task: simTask, Node: c.claim.node, Epoch: c.claim.epoch, Executor: c.claim.holder}, true, nil
}

// assignment is the source node's look at its assignments (its copy,
// supervise.Assignments, kept by a watch: the model reads the record, at
// the node's next poll of its copy).
func (c *coordinator) assignment(tick uint64, node string) (supervise.Assignment, bool, error) {
	if c.down(tick) {
		return supervise.Assignment{}, false, errCoordDown
	}
	if c.assign == nil || c.assign.Source != node {
		return supervise.Assignment{}, false, nil
	}
	return *c.assign, true, nil
}

// snapshot is supervise.ReadSnapshot on the model: everything Decide
// reads, as of now.
func (c *coordinator) snapshot() supervise.Snapshot {
	s := supervise.Snapshot{
		Nodes:       map[string]supervise.NodeRecord{},
		Replicas:    map[uint32][]supervise.Replica{partitionID: append([]supervise.Replica(nil), c.replicas...)},
		Tasks:       []claim.TaskRecord{c.task},
		Claims:      map[claim.Task]uint64{},
		Assignments: map[claim.Task]supervise.Assignment{},
	}
	for id, n := range c.nodes {
		s.Nodes[id] = n
	}
	if c.claim != nil {
		s.Claims[simTask] = c.claim.epoch
	}
	if c.assign != nil {
		s.Assignments[simTask] = *c.assign
	}
	return s
}

// apply writes one of Decide's actions as the supervisor's driver does: a
// compare-and-swap on the assignment's revision, with the revoke of the
// claim of RevokeEpoch in the same transaction. applied is false when the
// compare failed.
func (c *coordinator) apply(tick uint64, a supervise.Action) (applied bool, err error) {
	if c.down(tick) {
		return false, errCoordDown
	}
	if a.Kind == supervise.ActNoSource {
		return true, nil
	}
	var mod int64
	if c.assign != nil {
		mod = c.assign.ModRevision
	}
	if mod != a.PrevModRevision {
		return false, nil
	}
	rev := c.write()
	switch a.Kind {
	case supervise.ActAssign:
		next := a.Assignment
		next.ModRevision = int64(rev)
		c.assign = &next
	case supervise.ActUnassign:
		c.assign = nil
	default:
		panic(fmt.Sprintf("sim: unknown action %s", a.Kind))
	}
	if a.RevokeEpoch != 0 && c.holds(a.RevokeEpoch) {
		c.claim = nil // the lease lives on, as etcd's does
	}
	return true, nil
}

// resetStale is the health task's task part (claim.ResetStale) on the
// model, by claim's own rules: a running task whose claim is gone, or not
// touched for staleAfter, goes back to pending, and its claim, if it
// still stands, is deleted with it. It returns why, or "".
func (c *coordinator) resetStale(tick uint64, staleAfter time.Duration) (string, error) {
	if c.down(tick) {
		return "", errCoordDown
	}
	var claimEpoch uint64
	if c.claim != nil {
		claimEpoch = c.claim.epoch
	}
	now := timeAt(tick)
	why := claim.StaleReason(c.task.Record, claimEpoch, now, staleAfter)
	if why == "" {
		return "", nil
	}
	was := c.task.Epoch
	next := claim.ResetRecord(c.task.Record, why, now)
	next.ModRevision = int64(c.write())
	c.task.Record = next
	if c.holds(was) {
		c.claim = nil
	}
	return why, nil
}

// checkHealth is the health task's node part (supervise.CheckHealth) on
// the model.
func (c *coordinator) checkHealth(tick uint64, lim supervise.HealthLimits) ([]supervise.HealthAction, error) {
	if c.down(tick) {
		return nil, errCoordDown
	}
	nodes := make([]supervise.NodeRecord, 0, len(c.nodes))
	for _, id := range c.order {
		if n, ok := c.nodes[id]; ok {
			nodes = append(nodes, n)
		}
	}
	acts := supervise.CheckHealth(nodes, timeAt(tick), lim)
	for _, a := range acts {
		c.write()
		if a.Kind == supervise.HealthRemove {
			delete(c.nodes, a.Node.ID)
			continue
		}
		n := c.nodes[a.Node.ID]
		n.Status = supervise.NodeNotResponding
		c.nodes[a.Node.ID] = n
	}
	return acts, nil
}

// activity is a node's activity update: its record's LastActive moves on
// and it is ready again. It writes nothing the revision counts: the nodes'
// updates are not what the run is about, and their revisions would only
// shift the epochs.
func (c *coordinator) activity(tick uint64, node string) {
	if c.down(tick) {
		return
	}
	if n, ok := c.nodes[node]; ok {
		n.LastActive, n.Status = timeAt(tick), supervise.NodeReady
		c.nodes[node] = n
	}
}

// nodeDies: node's process is gone; its record goes when its lease runs
// out, ttl ticks from its last activity update (this tick's).
func (c *coordinator) nodeDies(tick, ttl uint64, node string) {
	if c.nodeGoneAt == nil {
		c.nodeGoneAt = map[string]uint64{}
	}
	c.nodeGoneAt[node] = tick + ttl
}

// String renders the coordinator's view, for the trace.
func (c *coordinator) String() string {
	cl := "no claim"
	if c.claim != nil {
		cl = fmt.Sprintf("claim %s epoch %d", c.claim.holder, c.claim.epoch)
		if at, ok := c.leases[c.claim.epoch]; ok {
			cl += fmt.Sprintf(" until tick %d", at)
		}
	}
	as := "unassigned"
	if c.assign != nil {
		as = fmt.Sprintf("assigned to %s seq %d", c.assign.Source, c.assign.Seq)
	}
	r := c.task.Record
	return fmt.Sprintf("rev %d, task %s (epoch %d, %d starts, %d claims), %s, %s", c.rev, r.Status, r.Epoch, r.Attempts, c.claims, cl, as)
}
