package sim

// supervisor plays the coordinator's leader as the parent of the rejoin
// (DESIGN.md step 9). It keeps no state of the task that the coordinator
// does not hold: it starts an attempt whenever the task is not done and
// has no claim (none yet, or the last one was released or expired), after
// a delay it remembers only in memory. It can die (faultSupervisor); a new
// leader is elected after a delay, forgets what the old one planned, and
// carries on from the task's record and claim alone.
type supervisor struct {
	leader     int // the leader's term, 1 for the first
	dead       bool
	takeoverAt uint64
	// planned, planAt: the next attempt starts at planAt. Memory only: a
	// failover loses it.
	planned bool
	planAt  uint64
}

// supervise runs the supervisor's tick, and starts the source side of
// every attempt whose word reached the source node by now (a word sent is
// delivered whether or not its sender lives on).
func (w *world) supervise() {
	if w.scripted {
		return
	}
	w.superviseTask()
	for _, a := range w.atts {
		if a.src == nil && w.tick >= a.srcUpAt {
			w.startSource(a)
		}
	}
}

func (w *world) superviseTask() {
	s := &w.sup
	if s.dead {
		if w.tick < s.takeoverAt {
			return
		}
		s.dead = false
		s.leader++
		w.stats.Takeovers++
		w.tracef("supervisor: leader %d elected, carries on from the coordinator: %s", s.leader, &w.coord)
		if c := &w.coord; c.claim == nil && c.task.status != taskDone {
			// Whatever the old leader planned is lost; the record says an
			// attempt is needed.
			w.stats.TakeoverStarts++
		}
	}
	c := &w.coord
	if c.task.status == taskDone {
		return
	}
	if !s.planned && c.claim == nil {
		switch {
		case c.task.attempts == 0:
			if w.tick >= uint64(w.k.StartTick) {
				s.planned, s.planAt = true, w.tick
			}
		default:
			s.planned, s.planAt = true, w.tick+1+uint64(w.net.IntN(30))
			w.tracef("supervisor: task %s, no claim (last epoch %d): next attempt at tick %d", c.task.status, c.task.epoch, s.planAt)
		}
	}
	if s.planned && w.tick >= s.planAt {
		s.planned = false
		if c.claim != nil {
			return // only the supervisor starts attempts: cannot happen
		}
		w.startAttempt(uint64(w.net.IntN(w.ctrlDelayMax() + 1)))
	}
}

// killSupervisor makes the supervisor die: what it planned is lost, and a
// new leader takes over election ticks later.
func (w *world) killSupervisor(election int) {
	s := &w.sup
	w.tracef("supervisor: leader %d dies (planned: %v); election takes %d ticks", s.leader, s.planned, election)
	s.dead, s.takeoverAt = true, w.tick+uint64(election)
	s.planned, s.planAt = false, 0
}
