package sim

import (
	"strconv"
	"time"

	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// The supervisor's timing, in ticks: a pass every passTicks, the health
// task every healthTicks (the product's are 200 ms and 1 s; here both are
// short against the claim's TTL, so a run does not wait on them).
const (
	passTicks   = 5
	healthTicks = 10
)

// supervisor plays the coordinator's leader (DESIGN.md steps 9 and 10) by
// the product's rules: each pass builds a supervise.Snapshot from the
// coordinator's model and applies what supervise.Decide returns (an
// assignment written with a compare-and-swap on its revision, with the
// revoke of a claim's epoch; an unassignment; no source); each health run
// applies supervise.CheckHealth to the nodes and claim.StaleReason with
// claim.ResetRecord to the task (claim.ResetStale's rule). It keeps no
// state of the task the coordinator does not hold. It can die
// (faultSupervisor); a new leader is elected after a delay and carries on
// from the coordinator alone.
type supervisor struct {
	leader     int // the leader's term, 1 for the first
	dead       bool
	takeoverAt uint64
	// fresh: a new leader that has not assigned anything yet.
	fresh      bool
	nextPass   uint64
	nextHealth uint64
}

// limits are Decide's limits, in ticks mapped to durations.
func (w *world) limits() supervise.Limits {
	return supervise.Limits{PassActionsMax: supervise.PassActionsMaxDefault, ClaimWithin: time.Duration(w.k.ClaimWithinTicks) * tickDuration}
}

// healthLimits are the health task's limits, in ticks mapped to
// durations: nodes update their activity every tick, so they are never
// silent but through an outage.
func (w *world) healthLimits() supervise.HealthLimits {
	return supervise.HealthLimits{
		NotRespondingAfter: time.Duration(4*w.k.ClaimTTLTicks) * tickDuration,
		RemoveAfter:        24 * time.Hour,
		StaleAfter:         time.Duration(w.k.StaleTicks) * tickDuration,
	}
}

// supervise runs the supervisor's tick: the election after a death, a
// pass when one is due, the health task when it is due. A run's supervisor
// starts at StartTick; a script's only when it asks (supervise, health).
func (w *world) supervise() {
	if (w.scripted && !w.auto) || w.tick < uint64(w.k.StartTick) {
		return
	}
	s := &w.sup
	if s.dead {
		if w.tick < s.takeoverAt {
			return
		}
		s.dead, s.fresh = false, true
		s.leader++
		s.nextPass, s.nextHealth = w.tick, w.tick
		w.stats.Takeovers++
		w.tracef("supervisor: leader %d elected, carries on from the coordinator: %s", s.leader, &w.coord)
	}
	if w.tick >= s.nextPass {
		s.nextPass = w.tick + passTicks
		w.supervisePass()
	}
	if w.tick >= s.nextHealth {
		s.nextHealth = w.tick + healthTicks
		w.healthRun()
	}
}

// supervisePass is one pass: Decide on a snapshot of the model, and its
// actions applied as the product's driver writes them.
func (w *world) supervisePass() int {
	if w.coord.down(w.tick) {
		return 0
	}
	acts := supervise.Decide(w.coord.snapshot(), timeAt(w.tick), w.limits())
	n := 0
	for _, a := range acts {
		applied, err := w.coord.apply(w.tick, a)
		switch {
		case err != nil:
			w.tracef("supervisor: %s: %v", a.Kind, err)
			continue
		case !applied:
			w.tracef("supervisor: %s lost its compare-and-swap", a.Kind)
			continue
		}
		n++
		if a.RevokeEpoch != 0 {
			w.stats.Revokes++
		}
		switch a.Kind {
		case supervise.ActAssign:
			w.stats.Assigns++
			if w.sup.fresh && w.coord.task.Attempts > 0 {
				// A new leader starts the next attempt from the record
				// alone.
				w.stats.TakeoverStarts++
			}
			w.sup.fresh = false
			w.tracef("supervisor: assigns the task to %s, seq %d (%s)%s", a.Assignment.Source, a.Assignment.Seq, a.Reason, revoked(a))
		case supervise.ActUnassign:
			w.tracef("supervisor: unassigns the task (%s)%s", a.Reason, revoked(a))
		case supervise.ActNoSource:
			w.tracef("supervisor: no source for the task (%s)", a.Reason)
		}
	}
	w.noteClaims()
	return n
}

func revoked(a supervise.Action) string {
	if a.RevokeEpoch == 0 {
		return ""
	}
	return ", revoking the claim of epoch " + strconv.FormatUint(a.RevokeEpoch, 10)
}

// healthRun is the health task on the model: supervise.CheckHealth on
// the nodes, then the stale rule of claim.ResetStale on the task.
func (w *world) healthRun() {
	acts, err := w.coord.checkHealth(w.tick, w.healthLimits())
	if err != nil {
		return
	}
	for _, a := range acts {
		w.tracef("health: %s", a)
	}
	why, err := w.coord.resetStale(w.tick, w.healthLimits().StaleAfter)
	if err == nil && why != "" {
		w.stats.StaleResets++
		w.tracef("health: task reset to pending: %s", why)
	}
	w.noteClaims()
}

// killSupervisor makes the supervisor die; a new leader takes over
// election ticks later.
func (w *world) killSupervisor(election int) {
	s := &w.sup
	w.tracef("supervisor: leader %d dies; election takes %d ticks", s.leader, election)
	s.dead, s.takeoverAt = true, w.tick+uint64(election)
}
