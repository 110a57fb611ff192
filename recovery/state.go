package recovery

import "fmt"

// State is where one side of a rejoin stands. Both sides share the enum;
// each has its own table of legal moves, and setting a state checks the
// edge, so an impossible move is a loud bug rather than a silent one.
//
// Destination:
//
//	buffering ──► proposing ──► streaming ──► catching-up ──► handing-off ──► live
//	    │             │             │              │               │
//	    └─────────────┴─────────────┴──────────────┴───────────────┴──► aborted
//
// Source:
//
//	answering ──► awaiting-boundary ──► streaming ──► catching-up ──► handing-off ──► done
//	    │                │                  │              │               │
//	    └────────────────┴──────────────────┴──────────────┴───────────────┴──► aborted
//
// The source reaches done only by the destination's HandoffAck (live at E
// with the digest handed off); from handing-off, a lost handoff (no ack
// within the stall window), the destination's abort (a digest mismatch)
// or an ack with another digest all lead to aborted, so the rejoin is
// attempted again rather than counted done (DESIGN.md step 7).
//
// Aborted and live/done are final: a new attempt is a new processor.
type State uint8

const (
	// StateBuffering: the destination has joined the partition's feed and
	// buffers every txn and heartbeat, waiting to hear every initiator.
	StateBuffering State = iota + 1
	// StateProposing: the destination sent P and waits for S.
	StateProposing
	// StateAnswering: the source waits for a proposal.
	StateAnswering
	// StateAwaitingBoundary: the source answered S and executes up to it.
	StateAwaitingBoundary
	// StateStreaming: snapshot blocks flow.
	StateStreaming
	// StateCatchingUp: catch-up rounds of the change log flow.
	StateCatchingUp
	// StateHandingOff: the source holds execution at E and ships the last
	// delta and the Handoff, then executes on with its stream freed and
	// awaits the HandoffAck; the destination applies the delta and checks
	// the digest.
	StateHandingOff
	// StateLive: the destination executes from E on and has sent its
	// HandoffAck.
	StateLive
	// StateDone: the destination acknowledged the handoff (live at E with
	// the source's digest): the rejoin is done.
	StateDone
	// StateAborted: the attempt ended without a live replica; everything it
	// held is freed.
	StateAborted
)

var stateNames = [...]string{
	StateBuffering:        "buffering",
	StateProposing:        "proposing",
	StateAnswering:        "answering",
	StateAwaitingBoundary: "awaiting-boundary",
	StateStreaming:        "streaming",
	StateCatchingUp:       "catching-up",
	StateHandingOff:       "handing-off",
	StateLive:             "live",
	StateDone:             "done",
	StateAborted:          "aborted",
}

func (s State) String() string {
	if int(s) < len(stateNames) && stateNames[s] != "" {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Final reports whether no move leaves s.
func (s State) Final() bool { return s == StateLive || s == StateDone || s == StateAborted }

// moves is a table of legal moves: moves[from] lists the states reachable
// in one step.
type moves map[State][]State

var destinationMoves = moves{
	StateBuffering:  {StateProposing, StateAborted},
	StateProposing:  {StateStreaming, StateAborted},
	StateStreaming:  {StateCatchingUp, StateHandingOff, StateAborted},
	StateCatchingUp: {StateHandingOff, StateAborted},
	StateHandingOff: {StateLive, StateAborted},
}

var sourceMoves = moves{
	StateAnswering:        {StateAwaitingBoundary, StateAborted},
	StateAwaitingBoundary: {StateStreaming, StateAborted},
	StateStreaming:        {StateCatchingUp, StateHandingOff, StateAborted},
	StateCatchingUp:       {StateHandingOff, StateAborted},
	StateHandingOff:       {StateDone, StateAborted},
}

// legal reports whether from → to is a move of the table.
func (m moves) legal(from, to State) bool {
	for _, s := range m[from] {
		if s == to {
			return true
		}
	}
	return false
}

// move checks and makes the move *cur → to. An illegal move is a bug in
// the processor, never the peer's doing (a peer's out-of-order message is
// answered with an abort before any move), so it panics.
func (m moves) move(cur *State, to State, side string) {
	if !m.legal(*cur, to) {
		panic(fmt.Sprintf("recovery: %s: illegal move %v → %v", side, *cur, to))
	}
	*cur = to
}
