package node

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/txnid"
)

// Heartbeats by slot (docs/DESIGN.md "Heartbeats by slot"). A feed's
// reader does not give each heartbeat to every replica as an event: it
// raises the feed's slot (beatSlot) and wakes the replicas that wait for
// one (beatWaiters). A replica reads the slots of the initiators it tracks
// (maybePullBeats) only while it needs heartbeats: while it has txns waiting
// for the safe point or an attempt under way (wantsBeats). An idle replica
// costs a heartbeat nothing.
//
// The order of a slot and the inbox. A feed's reader puts a txn of
// initiator B into the replica's inbox and only then raises B's slot past
// it; a replica that read the slot's value v and applied it at once could
// run a txn of another initiator above a txn of B below v still in its
// inbox, which then arrives too late: the replicas diverge. So a replica
// that pulls the slots reads the values first and then notes k, the
// events in its inbox; every txn of B below v was put into the inbox
// before v was stored, so before the value was read, and is among those k
// events or already taken: the inbox is FIFO, an enqueue is complete when
// do returns, the reader's store of v happened after it and the replica's
// load of v before len(r.in), and only the replica takes from the inbox,
// so the count it reads includes that txn if it is still there. It applies the values only once those k events have run
// (beatsDue). Applied later than its place on the feed, a heartbeat may
// find a txn of B above it taken already: it is then skipped (beatIn's
// floor), the txn saying more.
//
// The meaning of a heartbeat for a destination attempt depends on when it
// came: the first ID it hears from B says that it buffers every txn of B
// above it (recovery.Coverage), which is true only of an ID sent after
// the attempt began. A value the slot held when the attempt started may
// be older, its later txns dropped by the replica that had no attempt, so
// the floors are raised to the slots' values when an attempt starts
// (checkBeatMode): only values stored after it apply. So are they when the
// replica starts tracking a feed already running (addInitiator).

// beatSlot holds the latest heartbeat read on one feed, Zero before the
// first. Only the feed's reader writes it, and only upwards; a feed of a
// new process (or a redial) has its own slot, so no value of a process
// reaches the tracking of another.
//
// Invariant: when the slot holds v, every txn of the feed with an ID
// below v has been put into its replica's inbox (readFeed enqueues in
// feed order, and the feed is in ID order).
//
// at is when the reader last raised it (Unix nanoseconds), stored before
// the value: a source's pacer measures a txn's wait from the arrival of
// the heartbeat that let it run (paceWaits).
type beatSlot struct {
	id atomic.Uint64
	at atomic.Int64
}

func (s *beatSlot) load() txnid.ID { return txnid.ID(s.id.Load()) }

// raised is when the slot last rose.
func (s *beatSlot) raised() time.Time { return time.Unix(0, s.at.Load()) }

// raise stores id if it is above the slot's value; the feed's reader only.
func (s *beatSlot) raise(id txnid.ID) {
	if uint64(id) > s.id.Load() {
		s.at.Store(time.Now().UnixNano())
		s.id.Store(uint64(id))
	}
}

// beatWaiters are the replicas waiting for a heartbeat (replica.armBeats):
// the next heartbeat read on any feed wakes each once. A replica is listed
// at most once while armed (it arms only when not armed), and only the
// waker disarms it, so an armed replica is always owed one wake.
type beatWaiters struct {
	mu      sync.Mutex
	waiting []*replica
}

func (w *beatWaiters) add(r *replica) {
	w.mu.Lock()
	w.waiting = append(w.waiting, r)
	w.mu.Unlock()
}

// wake wakes every waiting replica: O(1) when none waits, whatever the
// number of replicas hosted.
func (w *beatWaiters) wake() {
	w.mu.Lock()
	waiting := w.waiting
	w.waiting = nil
	w.mu.Unlock()
	for _, r := range waiting {
		r.wake()
	}
}

// beatIn is what a replica knows of one tracked initiator's slot.
type beatIn struct {
	slot *beatSlot
	// seen is the highest value read from the slot. The last values read
	// apply once the replica's beatsDue events have run.
	seen txnid.ID
	// floor: no heartbeat at or below it applies. It is at least the
	// highest ID the core took in from the initiator (one at or below
	// would go backwards) and the slot's value when the replica began to
	// track the feed or started its current destination attempt.
	floor txnid.ID
}

// bindBeats makes the replica read in's heartbeats from slot; a slot of
// another feed replaces the one bound.
func (r *replica) bindBeats(in txnid.Initiator, slot *beatSlot) {
	if b := r.beats[in]; b != nil && b.slot == slot {
		return
	}
	v := slot.load()
	b := &beatIn{slot: slot, seen: v, floor: v}
	if old := r.beats[in]; old != nil {
		b.floor = max(b.floor, old.floor)
	}
	r.beats[in] = b
}

// tookFrom raises in's floor to id, which the core took in.
func (r *replica) tookFrom(id txnid.ID) {
	if b := r.beats[id.Initiator()]; b != nil && id > b.floor {
		b.floor = id
	}
}

// wantsBeats reports whether the replica needs heartbeats now: it has
// txns waiting for the safe point, or an attempt is under way (a
// destination needs them to propose and to go live, a source to reach
// its handoff).
func (r *replica) wantsBeats() bool {
	if r.wantsTick() {
		return true
	}
	exec := r.core.Executor()
	return exec != nil && exec.Queued() > 0
}

// maybePullBeats reads the slots if the replica wants heartbeats and has
// no values pending, and reports whether any slot moved. The values apply
// once the events now in the inbox have run (at once if there are none).
func (r *replica) maybePullBeats() bool {
	if r.beatsDue >= 0 || !r.wantsBeats() {
		return false
	}
	moved := false
	for _, b := range r.beats {
		if v := b.slot.load(); v > b.seen {
			b.seen, moved = v, true
		}
	}
	if !moved {
		return false
	}
	// After the loads: every txn below a value read is in the inbox by
	// now, or was taken (beatSlot's invariant).
	r.beatsDue = len(r.in)
	if r.beatsDue == 0 {
		r.applyBeats()
	}
	return true
}

// ran is called after each event the loop takes: it raises the floors
// if the event started a destination attempt, and applies the values
// pulled once the events queued before them have run.
func (r *replica) ran() {
	r.checkBeatMode()
	if r.beatsDue > 0 {
		r.beatsDue--
		if r.beatsDue == 0 {
			r.applyBeats()
		}
	}
}

// checkBeatMode raises the floors to the slots' values when a destination
// attempt started since the last look.
func (r *replica) checkBeatMode() {
	d := r.core.Destination()
	if d == r.beatDst {
		return
	}
	r.beatDst = d
	if d == nil {
		return
	}
	for _, b := range r.beats {
		v := b.slot.load()
		b.seen, b.floor = max(b.seen, v), max(b.floor, v)
	}
}

// applyBeats gives the core the values pulled, each above its floor.
func (r *replica) applyBeats() {
	r.beatsDue = -1
	r.checkBeatMode()
	for _, b := range r.beats {
		if b.seen > b.floor {
			if r.paceT != nil {
				r.paceT.took(b.slot.raised())
			}
			r.onBeat(b.seen)
			b.floor = max(b.floor, b.seen)
		}
	}
	r.paceLook()
}

// armBeats lists the replica to be woken by the next heartbeat, unless it
// is listed already.
func (r *replica) armBeats() {
	if r.armed.Load() {
		return
	}
	r.armed.Store(true)
	r.n.feeds.waiters.add(r)
}

// wake, by a feed's reader, queues a wake-up if the replica is armed. It
// never blocks: a full inbox has events enough to wake the loop, which
// arms again before it waits.
func (r *replica) wake() {
	if !r.armed.CompareAndSwap(true, false) {
		return
	}
	select {
	case r.in <- r.wakeEv:
		r.wakes.Add(1)
	default:
	}
}
