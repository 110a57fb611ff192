package recovery

import (
	"errors"
	"fmt"
	"slices"

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
//
// An initiator's feed may open while the attempt runs (a node that just
// started, a dial that failed until now): what it sent before reached the
// source and not the destination. AddInitiator takes it in; before the
// proposal, the proposal waits for it like any other. At the handoff,
// Covers checks that the destination holds every txn >= E of every
// initiator the source may still run a txn of, which a late initiator
// heard only above E, or not at all, fails (docs/DESIGN.md "Feeds that
// open late").
type Coverage struct {
	// first holds the first ID heard from each initiator, removed ones
	// included. Invariant: the destination's buffer holds every txn of
	// initiator i with ID >= first[i]; an initiator removed after it was
	// heard keeps its entry (its tail is repaired, its txns stay queued).
	first map[txnid.Initiator]txnid.ID
	// initiators are the initiators the destination hears now: those it
	// was started with or added since, less those removed. The proposal
	// waits for every one of them.
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

// AddInitiator: a feed from in opened while the attempt runs. Its first ID
// is yet to come; whatever it sent before is not in the buffer. An
// initiator heard before and removed since comes back as a new sequence
// (a restarted process), so its first ID is taken afresh.
func (c *Coverage) AddInitiator(in txnid.Initiator) {
	if c.initiators[in] {
		return
	}
	c.initiators[in] = true
	delete(c.first, in)
}

// RemoveInitiator stops waiting for an initiator that left the partition.
// What was heard from it stays recorded: its txns stay in the buffer.
func (c *Coverage) RemoveInitiator(in txnid.Initiator) {
	delete(c.initiators, in)
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

// ErrUncovered: the destination cannot go live at E, because it may lack
// a txn >= E of an initiator (docs/DESIGN.md "Feeds that open late").
var ErrUncovered = errors.New("recovery: an initiator's txns at or above E are not all here")

// Covers checks that the destination holds every txn >= e of every
// initiator it hears and of every one in sources, the initiators the
// source may still run a txn of at or after e (wire.Handoff.Initiators):
// each must have been heard with a first ID at or below e. The initiators
// heard before the proposal always are (P is their maximum, and e >= P);
// one added later may have been heard only above e, and one the source
// runs may never have been heard here at all.
func (c *Coverage) Covers(e txnid.ID, sources []txnid.Initiator) error {
	check := func(in txnid.Initiator) error {
		f, ok := c.first[in]
		switch {
		case !ok:
			return fmt.Errorf("%w: initiator %d not heard here, E=%v", ErrUncovered, in, e)
		case f > e:
			return fmt.Errorf("%w: initiator %d heard here from %v on, above E=%v", ErrUncovered, in, f, e)
		}
		return nil
	}
	for _, in := range sources {
		if err := check(in); err != nil {
			return err
		}
	}
	ins := make([]txnid.Initiator, 0, len(c.initiators))
	for in := range c.initiators {
		ins = append(ins, in)
	}
	slices.Sort(ins) // the first failure named is the same every run
	for _, in := range ins {
		if err := check(in); err != nil {
			return err
		}
	}
	return nil
}

// SourceView is what the source's answer and activation depend on: the
// order of the txns its store runs, one at a time in txn-ID order
// (SourceStore). partition.Executor satisfies it.
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
