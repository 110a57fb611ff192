package recovery

import (
	"errors"
	"fmt"

	"github.com/rejoin-db/rejoin/cow"
	"github.com/rejoin-db/rejoin/wire"
)

// Errors a processor returns to its driver, classified with errors.Is. They
// say why a message was refused; whether the attempt survives is the
// processor's State.
var (
	// ErrStaleEpoch: the message belongs to a superseded attempt (a lower
	// fencing epoch than this processor's) and was dropped unread.
	ErrStaleEpoch = errors.New("recovery: stale epoch")
	// ErrWrongPartition: the message names another partition.
	ErrWrongPartition = errors.New("recovery: message for another partition")
	// ErrAborted: the attempt is over (aborted); nothing more is accepted.
	ErrAborted = errors.New("recovery: attempt aborted")
	// ErrConfig: a processor's configuration is out of range.
	ErrConfig = errors.New("recovery: bad config")
)

// AbortError is why an attempt aborted: the reason that travels in
// wire.Abort, and the detail for people.
type AbortError struct {
	Reason wire.AbortReason
	Text   string
	// Remote is true when the peer aborted and this side followed.
	Remote bool
}

func (e *AbortError) Error() string {
	side := "local"
	if e.Remote {
		side = "peer"
	}
	return fmt.Sprintf("recovery: aborted (%s, %s): %s", e.Reason, side, e.Text)
}

// Metrics is what one side of one attempt did, as a plain value.
type Metrics struct {
	// Snapshot, Deletes and Upserts count the blocks, rows and tuple bytes
	// of each kind sent (source) or applied (destination).
	Snapshot, Deletes, Upserts cow.Counts
	// Rounds counts catch-up rounds, the final delta included (source).
	Rounds int
	// LogBytesPeak is the change log's peak (source).
	LogBytesPeak int
	// ThrottledTicks counts ticks after which the source was pacing or
	// holding execution to let its change log drain.
	ThrottledTicks int64
	// HandoffPauseTicks is how long the source held execution for the
	// handoff, in ticks (the driver measures wall time around it as well).
	HandoffPauseTicks uint64
	// StaleRejected counts messages dropped for a superseded epoch.
	StaleRejected int64
	// TxnsDropped counts the destination's buffered txns below E, dropped at
	// handoff because the snapshot already holds their effect.
	TxnsDropped int
}

// checkHeader applies the fencing rule to an incoming message: a lower
// epoch than ours is a superseded attempt's and is dropped; a higher one
// means ours is superseded.
func checkHeader(own wire.MsgHeader, m wire.Message) (superseded bool, err error) {
	h := m.Header()
	switch {
	case h.Partition != own.Partition:
		return false, fmt.Errorf("%w: %s for partition %d, this rejoin is of %d", ErrWrongPartition, m.Type(), h.Partition, own.Partition)
	case h.Epoch < own.Epoch:
		return false, fmt.Errorf("%w: %s of epoch %d, this attempt has %d", ErrStaleEpoch, m.Type(), h.Epoch, own.Epoch)
	case h.Epoch > own.Epoch:
		return true, nil
	}
	return false, nil
}

// addCounts adds the block b to the counts of its kind.
func (m *Metrics) addBlock(kind wire.BlockKind, rows uint32, bytes int) {
	c := &m.Snapshot
	switch kind {
	case wire.BlockDeletes:
		c = &m.Deletes
	case wire.BlockUpserts:
		c = &m.Upserts
	}
	c.Blocks++
	c.Rows += int64(rows)
	c.Bytes += int64(bytes)
}
