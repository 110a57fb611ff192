package txnid

import (
	"container/heap"
	"errors"
	"fmt"
	"slices"
)

var (
	// ErrNotIncreasing reports an ID that is not above the last one accepted
	// from the same initiator: a duplicate or an out-of-order arrival.
	ErrNotIncreasing = errors.New("txnid: id not increasing")
	// ErrUnknownInitiator reports an ID from an initiator the Tracker does
	// not hold.
	ErrUnknownInitiator = errors.New("txnid: unknown initiator")
)

// Tracker computes a replica's safe txn ID: the minimum, over the initiators
// it hears from, of the last ID seen from each. A replica may execute any
// queued txn whose ID is <= Safe().
//
// Safe() is O(1) and Observe, Add and Remove are O(log n) in the number of
// initiators, through a min-heap. A scan would do for the handful of
// initiators a partition usually has, but Observe runs once per txn and
// heartbeat on every replica, and the heap costs little code.
//
// A Tracker is not safe for concurrent use; the replica's executor owns it.
type Tracker struct {
	// Invariant: nothing <= Safe() can still arrive from any tracked
	// initiator. It holds because each entry's last only grows (Observe
	// rejects anything else), so every future arrival from initiator i is
	// > byInitiator[i].last >= heap[0].last.
	//
	// byInitiator and heap hold the same entries; heap is a min-heap on last
	// and each entry's index is its position in heap.
	byInitiator map[Initiator]*trackerEntry
	heap        trackerHeap
}

type trackerEntry struct {
	initiator Initiator
	last      ID // Zero (or its floor) until the initiator speaks.
	index     int
}

// NewTracker returns a Tracker with no initiators.
func NewTracker() *Tracker {
	return &Tracker{byInitiator: make(map[Initiator]*trackerEntry)}
}

// Add starts tracking in. Until in speaks it holds Safe() at Zero, so adding
// an initiator can move Safe() down; a caller that has already executed up to
// some safe point must only add an initiator whose IDs are known to be above
// it. Adding an initiator already tracked does nothing.
func (t *Tracker) Add(in Initiator) { t.AddAbove(in, Zero) }

// AddAbove starts tracking in, known to send nothing at or below floor,
// as if floor were the last ID it sent: Safe() does not fall below floor
// for it, and an ID of it at or below floor is refused by Observe.
// Adding an initiator already tracked does nothing.
func (t *Tracker) AddAbove(in Initiator, floor ID) {
	if _, ok := t.byInitiator[in]; ok {
		return
	}
	e := &trackerEntry{initiator: in, last: floor}
	t.byInitiator[in] = e
	heap.Push(&t.heap, e)
}

// Remove stops tracking in, which can move Safe() up when in was the slowest.
// Its history is forgotten: if it is added again, it starts from Zero.
// Removing an initiator not tracked does nothing.
func (t *Tracker) Remove(in Initiator) {
	e, ok := t.byInitiator[in]
	if !ok {
		return
	}
	delete(t.byInitiator, in)
	heap.Remove(&t.heap, e.index)
}

// Observe records id, a txn or a heartbeat, as the latest from in.
func (t *Tracker) Observe(in Initiator, id ID) error {
	e, ok := t.byInitiator[in]
	if !ok {
		return fmt.Errorf("%w: %d sent %s", ErrUnknownInitiator, in, id)
	}
	if id <= e.last {
		return fmt.Errorf("%w: initiator %d sent %s after %s", ErrNotIncreasing, in, id, e.last)
	}
	e.last = id
	heap.Fix(&t.heap, e.index)
	return nil
}

// Safe returns the safe txn ID, and false when no initiator is tracked (then
// nothing bounds what may still arrive).
func (t *Tracker) Safe() (ID, bool) {
	if len(t.heap) == 0 {
		return Zero, false
	}
	return t.heap[0].last, true
}

// Last returns the last ID accepted from in: Zero if in has not spoken, and
// false if in is not tracked.
func (t *Tracker) Last(in Initiator) (ID, bool) {
	e, ok := t.byInitiator[in]
	if !ok {
		return Zero, false
	}
	return e.last, true
}

// Initiators returns the tracked initiators in increasing order.
func (t *Tracker) Initiators() []Initiator {
	out := make([]Initiator, 0, len(t.heap))
	for in := range t.byInitiator {
		out = append(out, in)
	}
	slices.Sort(out)
	return out
}

// Len returns how many initiators are tracked.
func (t *Tracker) Len() int { return len(t.heap) }

// checkInvariants verifies the heap and index against the map. It is O(n),
// for tests and fuzzing only.
func (t *Tracker) checkInvariants() error {
	if len(t.heap) != len(t.byInitiator) {
		return fmt.Errorf("heap holds %d entries, map %d", len(t.heap), len(t.byInitiator))
	}
	for i, e := range t.heap {
		if e.index != i {
			return fmt.Errorf("entry for %d at %d thinks it is at %d", e.initiator, i, e.index)
		}
		if t.byInitiator[e.initiator] != e {
			return fmt.Errorf("entry for %d in heap is not the map's", e.initiator)
		}
		if i > 0 && t.heap[(i-1)/2].last > e.last {
			return fmt.Errorf("heap order broken at %d: parent %s > %s", i, t.heap[(i-1)/2].last, e.last)
		}
	}
	return nil
}

// trackerHeap implements heap.Interface; only Tracker touches it.
type trackerHeap []*trackerEntry

func (h trackerHeap) Len() int           { return len(h) }
func (h trackerHeap) Less(i, j int) bool { return h[i].last < h[j].last }

func (h trackerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *trackerHeap) Push(x any) {
	e := x.(*trackerEntry)
	e.index = len(*h)
	*h = append(*h, e)
}

func (h *trackerHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil // Let the entry be collected.
	*h = old[:len(old)-1]
	e.index = -1
	return e
}
