package txnid

import (
	"errors"
	"fmt"
)

// Generator issues the IDs of one initiator, txns and heartbeats alike.
//
// A Generator is not safe for concurrent use: its owner (the initiator's
// event loop) serialises calls, which is also what makes the order of IDs the
// order in which requests were sequenced.
type Generator struct {
	clock     func() int64
	initiator Initiator

	// ms and counter are the logical time of the last ID issued: last ==
	// Make(ms, counter, initiator) once Next has run. Before that, last is
	// Zero and (ms, counter) is (0, 0), a slot that is treated as used so
	// that the first ID is above Zero even when the clock reads the epoch.
	// ms never falls behind a valid clock reading already seen, and only
	// runs ahead of the clock when a millisecond's counter overflows.
	ms      int64
	counter uint32
	last    ID
}

// NewGenerator returns a Generator for initiator. clock returns Unix
// milliseconds; it is injected so that tests and the simulator control time.
func NewGenerator(initiator Initiator, clock func() int64) (*Generator, error) {
	if initiator >= InitiatorsMax {
		return nil, fmt.Errorf("%w: %d, want < %d", ErrInitiatorRange, initiator, InitiatorsMax)
	}
	if clock == nil {
		return nil, errors.New("txnid: nil clock")
	}
	return &Generator{clock: clock, initiator: initiator}, nil
}

// Next returns an ID strictly above every ID this Generator issued before.
//
// A clock reading that is not ahead of the logical time (a stall or a step
// back), or that the layout cannot represent (before the epoch or after
// MillisMax, which can only be a broken clock), is treated as a stall: the
// counter moves on, and a full counter moves logical time one millisecond
// ahead. Logical time rejoins the clock once the clock passes it.
//
// Next panics only if the ID space itself is used up, which takes logical
// time reaching MillisMax, in the year 2165.
func (g *Generator) Next() ID {
	now := g.clock()
	valid := now >= EpochUnixMillis && now-EpochUnixMillis <= MillisMax
	switch {
	case valid && now-EpochUnixMillis > g.ms:
		g.ms, g.counter = now-EpochUnixMillis, 0
	case g.counter < IDsPerMillisMax-1:
		g.counter++
	case g.ms < MillisMax:
		g.ms, g.counter = g.ms+1, 0
	default:
		panic(fmt.Sprintf("txnid: initiator %d exhausted the ID space at %s", g.initiator, g.last))
	}
	id := Make(g.ms, g.counter, g.initiator)
	if id <= g.last {
		panic(fmt.Sprintf("txnid: generator went from %s to %s", g.last, id))
	}
	g.last = id
	return id
}

// Advance makes every ID Next returns from now on lie above floor, an ID
// of any initiator: a replica that executed up to floor before it heard
// of this initiator refuses anything at or below it, so an initiator that
// joins replicas already running (a start, a restart, a feed opened late)
// must first pass what they executed. Logical time runs ahead of the
// clock until the clock catches up, as after a counter overflow. A floor
// at or below the logical time changes nothing.
func (g *Generator) Advance(floor ID) {
	ms, counter := floor.Millis(), floor.Counter()
	if ms > g.ms || (ms == g.ms && counter > g.counter) {
		// The next ID takes (ms, counter+1) or a later slot, which is
		// above floor whatever the two initiators' ids.
		g.ms, g.counter = ms, counter
	}
}

// Last returns the last ID Next returned, or Zero before the first call.
func (g *Generator) Last() ID { return g.last }

// Initiator returns the initiator whose IDs g issues.
func (g *Generator) Initiator() Initiator { return g.initiator }
