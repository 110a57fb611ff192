package supervise

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
)

// Snapshot is what one supervision pass sees: the registered (live) nodes,
// the placement, the task records, the claim keys and the assignments.
// Decide reads nothing else, so a snapshot written down replays a pass.
type Snapshot struct {
	Nodes       map[string]NodeRecord     // by id; a node absent is dead
	Replicas    map[uint32][]Replica      // by partition; a pass reads those of the tasks not final
	Tasks       []claim.TaskRecord        // in key order
	Claims      map[claim.Task]uint64     // epoch of each claim key present
	Assignments map[claim.Task]Assignment // by task
}

// Limits bound one pass and say when an assignment has gone stale.
type Limits struct {
	// PassActionsMax bounds the actions of one pass, so a pass over a big
	// backlog stays short and the next one sees fresher state.
	PassActionsMax int
	// ClaimWithin is how long an assigned source has to claim a pending
	// task before the task is assigned elsewhere.
	ClaimWithin time.Duration
}

// ActionKind is what the driver does for one action.
type ActionKind uint8

const (
	// ActAssign writes Assignment (a new attempt) and, if RevokeEpoch is
	// set, deletes the claim of that epoch in the same transaction so its
	// executor stops within a claim window.
	ActAssign ActionKind = iota + 1
	// ActUnassign deletes the assignment of a task that is done or failed,
	// or whose generation it does not belong to.
	ActUnassign
	// ActNoSource says a task needs a source and none qualifies; the
	// driver logs it and the next pass looks again.
	ActNoSource
)

func (k ActionKind) String() string {
	switch k {
	case ActAssign:
		return "assign"
	case ActUnassign:
		return "unassign"
	case ActNoSource:
		return "no-source"
	}
	return fmt.Sprintf("ActionKind(%d)", uint8(k))
}

// Action is one decision of a pass.
type Action struct {
	Kind ActionKind
	Task claim.Task
	// Assignment is the one to write (ActAssign).
	Assignment Assignment
	// PrevModRevision is the assignment key's ModRevision in the snapshot
	// (0: absent): the write is a compare-and-swap on it.
	PrevModRevision int64
	// RevokeEpoch is the epoch of the claim to delete with the write, 0
	// for none.
	RevokeEpoch uint64
	Reason      string
}

// Decide is the supervisor's whole logic: from a snapshot and the time it
// returns what to write. It reads no clock and does no I/O.
//
// For each open (pending or running) task it keeps the assignment when its
// source is alive, still hosts a live replica and has not declined, and
// the attempt is under way (running under a claim of its epoch) or still
// within ClaimWithin of being assigned. Otherwise it assigns the task as a
// new attempt (Seq+1) to the least loaded other qualifying source: a node
// with a live record, not marked not-responding, hosting a live replica of
// the partition, not the destination, not in Declined, and below its
// OutgoingMax counting the assignments of this pass. When every such
// source has declined, Declined is cleared ClaimWithin after the last
// assignment, so a decline delays a task but never strands it. A closed task's
// assignment is deleted. An open task whose destination node is dead is
// ended (assignment and claim deleted) and left pending until the
// destination registers again.
func Decide(s Snapshot, now time.Time, lim Limits) []Action {
	load := map[string]int{}
	keep := make(map[claim.Task]bool, len(s.Tasks))
	for _, t := range s.Tasks {
		a, ok := s.Assignments[t.Task]
		if ok && !t.Status.Final() && a.Opened == t.Opened && keepReason(s, t, a, now, lim) == "" {
			keep[t.Task] = true
			load[a.Source]++
		}
	}
	var out []Action
	for _, t := range s.Tasks {
		if len(out) >= lim.PassActionsMax {
			break
		}
		a, assigned := s.Assignments[t.Task]
		if t.Status.Final() || (assigned && a.Opened > t.Opened) {
			// Closed, or an assignment from a generation this snapshot does
			// not know yet (a newer record than the task list): leave the
			// latter for the next pass.
			if assigned && t.Status.Final() {
				out = append(out, Action{Kind: ActUnassign, Task: t.Task, PrevModRevision: a.ModRevision, Reason: "task " + t.Status.String()})
			}
			continue
		}
		if _, alive := s.Nodes[t.Task.Dest]; !alive {
			// The replica being rebuilt died with its node: the attempt is
			// moot. End it (deleting its claim stops its executor; deleting
			// the assignment frees its source) and wait: the task is
			// assigned again once the destination registers again.
			epoch, claimed := s.Claims[t.Task]
			if assigned || claimed {
				out = append(out, Action{Kind: ActUnassign, Task: t.Task, PrevModRevision: a.ModRevision, RevokeEpoch: epoch,
					Reason: fmt.Sprintf("destination %s dead (no lease)", t.Task.Dest)})
			}
			continue
		}
		if keep[t.Task] {
			continue
		}
		next := Assignment{Task: t.Task, Seq: 1, Opened: t.Opened, AssignedAt: now}
		reason := "unassigned"
		var prevMod int64
		var revoke uint64
		var prevSource string
		if assigned {
			prevMod = a.ModRevision
			if a.Opened == t.Opened {
				prevSource = a.Source
				next.Seq = a.Seq + 1
				next.Declined = slices.Clone(a.Declined)
				reason = keepReason(s, t, a, now, lim)
			} else {
				reason = "new generation"
			}
		}
		if epoch, ok := s.Claims[t.Task]; ok {
			// The task is reassigned while a claim stands: the old attempt
			// is over, and deleting its claim stops its executor (the epoch
			// fences whatever it still sends) and frees the task for the new
			// source at once instead of after the claim's TTL.
			revoke = epoch
			next.Superseded = epoch
		} else if t.Status == claim.StatusRunning {
			next.Superseded = t.Epoch
		}
		src, ok := pickSource(s, t.Task, prevSource, next.Declined, load)
		if !ok && len(next.Declined) > 0 && now.Sub(a.AssignedAt) > lim.ClaimWithin {
			// Every qualifying source has declined. A decline is "over my
			// limit now", not "never": after ClaimWithin they are asked
			// again rather than leave the task stuck for the generation.
			next.Declined = nil
			reason += fmt.Sprintf("; every source declined, asking again after %s", lim.ClaimWithin)
			src, ok = pickSource(s, t.Task, prevSource, nil, load)
		}
		if !ok {
			out = append(out, Action{Kind: ActNoSource, Task: t.Task, Reason: reason})
			continue
		}
		load[src]++
		next.Source, next.Reason = src, reason
		out = append(out, Action{Kind: ActAssign, Task: t.Task, Assignment: next, PrevModRevision: prevMod, RevokeEpoch: revoke, Reason: reason})
	}
	return maybeUnassignOrphans(s, out, lim)
}

// maybeUnassignOrphans appends, within the pass's bound, the deletion of
// assignments whose task record is gone (deleted by an operator), in task
// order, so they do not hold their sources' load forever.
func maybeUnassignOrphans(s Snapshot, out []Action, lim Limits) []Action {
	if len(out) >= lim.PassActionsMax || len(s.Assignments) == 0 {
		return out
	}
	known := make(map[claim.Task]bool, len(s.Tasks))
	for _, t := range s.Tasks {
		known[t.Task] = true
	}
	var orphans []Assignment
	for task, a := range s.Assignments {
		if !known[task] {
			orphans = append(orphans, a)
		}
	}
	slices.SortFunc(orphans, func(x, y Assignment) int {
		return cmp.Or(cmp.Compare(x.Task.Partition, y.Task.Partition), cmp.Compare(x.Task.Dest, y.Task.Dest))
	})
	for _, a := range orphans {
		if len(out) >= lim.PassActionsMax {
			break
		}
		out = append(out, Action{Kind: ActUnassign, Task: a.Task, PrevModRevision: a.ModRevision, Reason: "no task record"})
	}
	return out
}

// keepReason says why assignment a of task t must be replaced, or "".
func keepReason(s Snapshot, t claim.TaskRecord, a Assignment, now time.Time, lim Limits) string {
	n, alive := s.Nodes[a.Source]
	_, claimed := s.Claims[t.Task]
	switch {
	case !alive:
		return fmt.Sprintf("source %s dead (no lease)", a.Source)
	case a.declinedBy(a.Source):
		return fmt.Sprintf("declined by %s", a.Source)
	case !hostsLive(s, t.Task.Partition, a.Source):
		return fmt.Sprintf("source %s has no live replica", a.Source)
	case claimed:
		// Under way, by this source or (DESIGN.md step 9) any executor that
		// claimed it: every claim is one attempt, and its epoch fences the
		// others.
		return ""
	case t.Status == claim.StatusRunning && a.Superseded != t.Epoch:
		return fmt.Sprintf("claim of epoch %d gone", t.Epoch)
	case now.Sub(a.AssignedAt) > lim.ClaimWithin:
		// Pending, or still running under the attempt this assignment
		// replaced: the new source has not claimed it yet.
		return fmt.Sprintf("not claimed within %s", lim.ClaimWithin)
	case n.Status == NodeNotResponding:
		return fmt.Sprintf("source %s not responding", a.Source)
	}
	return ""
}

func hostsLive(s Snapshot, p uint32, node string) bool {
	for _, r := range s.Replicas[p] {
		if r.Node == node {
			return r.State == recovery.ReplicaLive
		}
	}
	return false
}

// pickSource returns the least loaded qualifying source of task, ties
// broken by id so a pass is deterministic; the previous source only if no
// other qualifies.
func pickSource(s Snapshot, task claim.Task, prev string, declined []string, load map[string]int) (string, bool) {
	var cands []string
	for _, r := range s.Replicas[task.Partition] {
		n, alive := s.Nodes[r.Node]
		switch {
		case r.State != recovery.ReplicaLive, !alive, n.Status == NodeNotResponding,
			r.Node == task.Dest, slices.Contains(declined, r.Node),
			load[r.Node] >= n.outgoingMax():
			continue
		}
		cands = append(cands, r.Node)
	}
	if len(cands) == 0 {
		return "", false
	}
	slices.SortFunc(cands, func(x, y string) int {
		// The previous source sorts last: a new attempt goes elsewhere when
		// it can (DESIGN.md step 9: restart the task on another node).
		if px, py := x == prev, y == prev; px != py {
			if px {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(load[x], load[y]), cmp.Compare(x, y))
	})
	return cands[0], true
}
