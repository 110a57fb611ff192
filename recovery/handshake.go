package recovery

import (
	"errors"
	"fmt"

	"github.com/rejoin-db/rejoin/txnid"
)

// The handshake agrees on the txn ID S at which the snapshot starts
// (DESIGN.md step 3): the destination proposes P, a txn ID such
// that it holds every txn >= P in its buffer; the source answers S >= P, a
// boundary it can reach without waiting for client traffic; the snapshot
// is then taken when every txn < S has executed at the source and none
// >= S has. The destination executes every buffered txn >= S after the
// snapshot, and drops the rest.

// ErrNoProposal: the destination cannot propose yet, because some initiator
// of the partition has sent it nothing since it joined the feed.
var ErrNoProposal = errors.New("recovery: no proposal yet: an initiator has not been heard from")

// Coverage records, for each initiator of the partition, the first txn ID
// (txn or heartbeat) the destination received after it joined the feed. As
// each initiator's stream only grows, the destination then holds every txn
// of initiator i with ID >= first[i].
//
// Why not simply the first buffered txn, as a single-initiator design would: with several
// initiators whose clocks differ, initiator j may have sent txn T before the
// destination joined, with T above the first txn the destination buffered
// from initiator i. Proposing that first txn would promise T, which the
// destination never received. The maximum over initiators of their first
// ID is the smallest P that is always safe; with one initiator it is the
// first buffered txn or heartbeat, as in the seed.
type Coverage struct {
	// first holds the first ID heard from each initiator. Invariant: the
	// destination's buffer holds every txn of initiator i with ID >= first[i].
	first map[txnid.Initiator]txnid.ID
	// initiators are the initiators that must be heard from before a
	// proposal is possible.
	initiators map[txnid.Initiator]bool
}

// NewCoverage returns a Coverage over the given initiators.
func NewCoverage(initiators []txnid.Initiator) *Coverage {
	c := &Coverage{
		first:      make(map[txnid.Initiator]txnid.ID, len(initiators)),
		initiators: make(map[txnid.Initiator]bool, len(initiators)),
	}
	for _, in := range initiators {
		c.initiators[in] = true
	}
	return c
}

// Observe records an ID (txn or heartbeat) the destination buffered.
func (c *Coverage) Observe(id txnid.ID) {
	in := id.Initiator()
	if _, seen := c.first[in]; !seen {
		c.first[in] = id
	}
}

// RemoveInitiator stops waiting for an initiator that left the partition.
func (c *Coverage) RemoveInitiator(in txnid.Initiator) {
	delete(c.initiators, in)
	delete(c.first, in)
}

// Proposal returns P: the maximum over the partition's initiators of the
// first ID heard from each. It fails with ErrNoProposal until every
// initiator has been heard from.
func (c *Coverage) Proposal() (txnid.ID, error) {
	if len(c.initiators) == 0 {
		return 0, fmt.Errorf("%w: the partition has no initiators", ErrNoProposal)
	}
	var p txnid.ID
	for in := range c.initiators {
		f, ok := c.first[in]
		if !ok {
			return 0, fmt.Errorf("%w: initiator %d", ErrNoProposal, in)
		}
		p = max(p, f)
	}
	return p, nil
}

// SourceView is what the source's answer and activation depend on: its
// executor's state. partition.Executor satisfies it.
type SourceView interface {
	// QueuedFrom returns the smallest queued, unexecuted txn ID >= p.
	QueuedFrom(p txnid.ID) (txnid.ID, bool)
	// Safe returns the safe txn ID: nothing <= it can still arrive.
	Safe() (txnid.ID, bool)
	// LastExecuted returns the highest executed txn ID.
	LastExecuted() txnid.ID
	// Ready returns the next txn that may execute, if any.
	Ready() (txnid.ID, bool)
}

// Answer returns S for a proposal P (DESIGN.md step 3): the next txn >= P that the
// source has queued and not executed, if there is one; otherwise the point
// just past the safe txn ID, which heartbeats alone move forward, so the
// handshake completes when no client traffic flows. S is never below P,
// and always above every txn the source has executed, so no txn is both in
// the snapshot and executed again from the destination's buffer.
func Answer(src SourceView, p txnid.ID) txnid.ID {
	if q, ok := src.QueuedFrom(p); ok {
		// Queued txns are all above the last executed one.
		return q
	}
	s := max(p, src.LastExecuted()+1)
	if safe, ok := src.Safe(); ok {
		s = max(s, safe+1)
	}
	return s
}

// AtBoundary reports whether the source stands at the boundary S: every txn
// < S has executed and none >= S has. That holds when no txn < S can still
// arrive (the safe txn ID is at least S-1) and none is waiting (the next
// ready txn, if any, is >= S). The source activates its table stream at
// that moment, before executing anything more.
func AtBoundary(src SourceView, s txnid.ID) bool {
	if src.LastExecuted() >= s {
		panic(fmt.Sprintf("recovery: source executed %v, past the agreed boundary %v", src.LastExecuted(), s))
	}
	safe, ok := src.Safe()
	if !ok || safe < s-1 {
		return false
	}
	next, ok := src.Ready()
	return !ok || next >= s
}
