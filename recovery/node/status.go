package node

import (
	"time"

	"github.com/rejoin-db/rejoin/recovery"
)

// Status is what a node reports on GET /status: itself and every replica
// it hosts. It is read by `rejoin status`, `rejoin demo` (progress bars)
// and tests.
type Status struct {
	Node    string    `json:"node"`
	Addr    string    `json:"addr"`
	HTTP    string    `json:"http"`
	Started time.Time `json:"started"`
	// TLS: every connection is mutual TLS from the cluster CA; Insecure:
	// none is (the node runs with --insecure).
	TLS      bool `json:"tls"`
	Insecure bool `json:"insecure,omitempty"`
	// TxnsExecuted counts the txns every replica of the node executed.
	TxnsExecuted uint64          `json:"txns_executed"`
	Replicas     []ReplicaStatus `json:"replicas"`
}

// ReplicaStatus is one replica: its content and the rejoins it takes part
// in, as destination (Rejoin) or source (Sources).
type ReplicaStatus struct {
	Partition uint32 `json:"partition"`
	// State is reported by name ("live", "rejoining", "needs-rejoin",
	// "held").
	State recovery.ReplicaState `json:"state"`
	// Held says why a held replica is held (docs/DESIGN.md "Holding a
	// partition").
	Held         string `json:"held,omitempty"`
	Rows         int64  `json:"rows"`
	Digest       uint64 `json:"digest"`
	LastExecuted uint64 `json:"last_executed"`
	TxnsExecuted uint64 `json:"txns_executed"`
	// Settling: the node lost its registration and has not yet settled
	// what its replicas may have missed meanwhile (registration.go). The
	// replica's answers are held, and it may still fail: it is not a copy
	// to count on until this clears.
	Settling bool `json:"settling,omitempty"`
	// Rejoin is the current or latest attempt that rebuilds this replica.
	Rejoin *RejoinStatus `json:"rejoin,omitempty"`
	// Sources are the attempts this replica serves, current or latest.
	Sources []RejoinStatus `json:"sources,omitempty"`
}

// RejoinStatus is one side of one rejoin attempt.
type RejoinStatus struct {
	Role  string `json:"role"` // "source" or "destination"
	Peer  string `json:"peer"` // the other side's node id
	Epoch uint64 `json:"epoch"`
	// Phase is the processor's state (recovery.State.String()).
	Phase string `json:"phase"`
	// Rows and Bytes are tuple rows and bytes sent (source) or applied
	// (destination): snapshot plus catch-up.
	Rows  int64 `json:"rows"`
	Bytes int64 `json:"bytes"`
	// SnapshotRows is the snapshot part of Rows.
	SnapshotRows int64   `json:"snapshot_rows"`
	Rounds       int     `json:"rounds"`
	LogBytesPeak int     `json:"log_bytes_peak"`
	ThrottledMs  float64 `json:"throttled_ms"`
	// PeerHoldMs is how long the source held execution because the
	// destination's buffer passed its mark (wire.Hold; source side), and
	// BufferBytesPeak the destination's buffer's peak (destination side).
	PeerHoldMs      float64 `json:"peer_hold_ms,omitempty"`
	BufferBytesPeak int64   `json:"buffer_bytes_peak,omitempty"`
	// HandoffPauseMs is the source's wall-time hold for the handoff
	// (source side only).
	HandoffPauseMs float64 `json:"handoff_pause_ms"`
	// PacedBytesPerSec is the pace of the source's snapshot now (0:
	// unpaced), PaceStarts how many times the partition's write latency
	// made it slow down (source side; pace.go).
	PacedBytesPerSec float64   `json:"paced_bytes_per_sec,omitempty"`
	PaceStarts       int       `json:"pace_starts,omitempty"`
	BlocksResent     int64     `json:"blocks_resent"`
	StaleRejected    int64     `json:"stale_rejected"`
	Started          time.Time `json:"started"`
	Ended            time.Time `json:"ended,omitzero"`
	// Held: a fault hold stopped the snapshot stream (POST /fault/hold).
	Held bool   `json:"held,omitempty"`
	Err  string `json:"err,omitempty"`
}
