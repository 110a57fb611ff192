package sim

import "fmt"

// coordinator is the simulated etcd (DESIGN.md steps 1 and 9; the model of
// recovery/claim), reduced to the one task a run has: the rejoin of the
// partition onto the destination node. It holds the task's claim key and its record, and a cluster-wide
// revision that every write raises by one, as etcd's does.
//
// Invariants:
//   - at most one claim key exists, created only if absent (acquire), so
//     at most one executor holds the task at a time in the coordinator's
//     view, whatever the executors believe;
//   - the epoch of a claim is the revision that created its key, and a key
//     is created only after the previous one's deletion (a write), so the
//     epochs of successive claims strictly grow;
//   - a keepalive extends a claim's lease and writes nothing (an etcd lease
//     keepalive does not raise the revision); a claim whose lease is not
//     kept alive for TTL ticks is deleted (expire), which is a write;
//   - the record is done at most once, and stays done: a completion is
//     accepted from any attempt (DESIGN.md step 9), later ones are
//     duplicates.
type coordinator struct {
	rev   uint64
	claim *claimKey // nil: no claim
	task  taskRecord
}

// claimKey is the task's claim: who holds it, its epoch, and when its
// lease runs out unless kept alive.
type claimKey struct {
	holder    int    // the executor: its attempt's number
	epoch     uint64 // the revision that created the key
	expiresAt uint64 // tick
}

// taskStatus is where the task's record stands.
type taskStatus uint8

const (
	taskOpen    taskStatus = iota // no attempt has claimed it yet
	taskRunning                   // claimed at least once, not done
	taskDone                      // an attempt went live
)

var taskStatusNames = [...]string{"open", "running", "done"}

func (s taskStatus) String() string { return taskStatusNames[s] }

// taskRecord is what the coordinator keeps of the task, and all a new
// supervisor knows of it after a failover.
type taskRecord struct {
	status   taskStatus
	epoch    uint64 // the epoch of the last claim
	attempts int    // claims made
	doneBy   uint64 // the epoch of the attempt that completed it
}

// write raises the revision: one write in the coordinator.
func (c *coordinator) write() uint64 {
	c.rev++
	return c.rev
}

// acquire creates the claim if there is none, in one transaction with the
// record's update, and returns its epoch.
func (c *coordinator) acquire(holder int, tick, ttl uint64) (uint64, bool) {
	if c.claim != nil || c.task.status == taskDone {
		return 0, false
	}
	e := c.write()
	c.claim = &claimKey{holder: holder, epoch: e, expiresAt: tick + ttl}
	c.task.status, c.task.epoch = taskRunning, e
	c.task.attempts++
	return e, true
}

// holds reports whether the claim of epoch is the task's claim now: what
// an executor's check reads.
func (c *coordinator) holds(epoch uint64) bool { return c.claim != nil && c.claim.epoch == epoch }

// keepalive extends the claim's lease if it is still the claim of epoch.
func (c *coordinator) keepalive(epoch, tick, ttl uint64) bool {
	if !c.holds(epoch) {
		return false
	}
	c.claim.expiresAt = tick + ttl
	return true
}

// release deletes the claim if it is still the claim of epoch.
func (c *coordinator) release(epoch uint64) bool {
	if !c.holds(epoch) {
		return false
	}
	c.claim = nil
	c.write()
	return true
}

// expire deletes the claim if its lease ran out by tick, and returns the
// epoch it had.
func (c *coordinator) expire(tick uint64) (uint64, bool) {
	if c.claim == nil || tick < c.claim.expiresAt {
		return 0, false
	}
	e := c.claim.epoch
	c.claim = nil
	c.write()
	return e, true
}

// complete marks the task done by the attempt of epoch; it reports false
// for a duplicate completion.
func (c *coordinator) complete(epoch uint64) bool {
	if c.task.status == taskDone {
		return false
	}
	c.task.status, c.task.doneBy = taskDone, epoch
	c.write()
	return true
}

// String renders the coordinator's view, for the trace.
func (c *coordinator) String() string {
	claim := "no claim"
	if c.claim != nil {
		claim = fmt.Sprintf("claim x%d epoch %d until tick %d", c.claim.holder, c.claim.epoch, c.claim.expiresAt)
	}
	return fmt.Sprintf("rev %d, task %s (last epoch %d, %d claims), %s", c.rev, c.task.status, c.task.epoch, c.task.attempts, claim)
}
