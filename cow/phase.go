package cow

import (
	"fmt"
	"slices"
)

// Phase is where a Stream is in its life. The legal moves are phaseMoves;
// setPhase panics on any other, because only this package moves phases
// and a wrong move is a bug:
//
//	Snapshot ──► BetweenRounds ◄──► Round
//	                  │
//	                  ▼
//	                Final ──► Done
//
//	and every phase ──► Inactive (Deactivate)
type Phase uint8

const (
	// PhaseSnapshot: the cursor is walking the tables; NextBlock returns
	// snapshot blocks.
	PhaseSnapshot Phase = iota + 1
	// PhaseBetweenRounds: the snapshot is done and no round is in flight;
	// changes collect in the log until StartRound or FinalDelta.
	PhaseBetweenRounds
	// PhaseRound: a catch-up round is in flight; NextBlock returns its
	// delete blocks, then its upsert blocks.
	PhaseRound
	// PhaseFinal: the last round, started by FinalDelta while the caller
	// holds the executor; the gate holds every txn and no change may
	// happen.
	PhaseFinal
	// PhaseDone: the final delta is out; the partition is held still for
	// the handoff until Deactivate.
	PhaseDone
	// PhaseInactive: Deactivate ran; the stream hears and holds nothing.
	PhaseInactive
)

var phaseNames = [...]string{
	PhaseSnapshot:      "snapshot",
	PhaseBetweenRounds: "between-rounds",
	PhaseRound:         "round",
	PhaseFinal:         "final",
	PhaseDone:          "done",
	PhaseInactive:      "inactive",
}

func (ph Phase) String() string {
	if int(ph) < len(phaseNames) && phaseNames[ph] != "" {
		return phaseNames[ph]
	}
	return fmt.Sprintf("phase(%d)", uint8(ph))
}

// phaseMoves is the table of legal moves: phaseMoves[from] lists the
// phases that may follow from.
var phaseMoves = [...][]Phase{
	PhaseSnapshot:      {PhaseBetweenRounds, PhaseInactive},
	PhaseBetweenRounds: {PhaseRound, PhaseFinal, PhaseInactive},
	PhaseRound:         {PhaseBetweenRounds, PhaseInactive},
	PhaseFinal:         {PhaseDone, PhaseInactive},
	PhaseDone:          {PhaseInactive},
	PhaseInactive:      nil,
}

// setPhase moves s to ph, checking the edge.
func (s *Stream) setPhase(ph Phase) {
	if !slices.Contains(phaseMoves[s.phase], ph) {
		panic(fmt.Sprintf("cow: illegal phase move %v -> %v", s.phase, ph))
	}
	s.phase = ph
}
