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
	// ErrBufferFull: a txn would take the destination's buffer past
	// BufferBytesMax; the attempt aborts (wire.AbortOverload).
	ErrBufferFull = errors.New("recovery: destination buffer full")
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
	// BlocksResent counts blocks sent again by Resume after a connection
	// broke.
	BlocksResent int64
	// StaleRejected counts messages dropped for a superseded epoch.
	StaleRejected int64
	// TxnsDropped counts the destination's buffered txns below E, dropped at
	// handoff because the snapshot already holds their effect.
	TxnsDropped int
	// Stream is the source's table stream's own account: the throttle's
	// holds and paces, txns over the per-txn reserve, deletes dropped.
	Stream cow.Metrics
	// TxnsLate counts feed txns below E that reached the destination after
	// it went live: their effect came with the snapshot, so they are taken
	// as heartbeats.
	TxnsLate int
	// BufferBytesPeak is the destination's buffer's peak before the
	// handoff, in the bytes BufferBytesMax counts.
	BufferBytesPeak int64
	// PeerHoldTicks counts ticks after which the source was holding
	// execution because the destination asked it to (wire.Hold).
	PeerHoldTicks int64
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

// addBlock counts one block under the counts of its kind.
func (m *Metrics) addBlock(kind wire.BlockKind, rows uint32, bytes int) {
	c := &m.Snapshot
	switch kind {
	case wire.BlockDeletes:
		c = &m.Deletes
	case wire.BlockUpserts:
		c = &m.Upserts
	}
	c.Add(int(rows), bytes)
}

// side is what the two processors share: the attempt's identity and state,
// the outbox, why it aborted, its metrics and tick counters, and the checks
// every incoming message meets before its handler.
type side struct {
	name   string
	header wire.MsgHeader
	moves  moves
	state  State
	out    []wire.Message
	err    *AbortError
	m      Metrics

	tick      uint64
	idleTicks int // ticks without progress; what counts as progress is each side's
	quietTick int // ticks since anything was sent
	// progress counts the events that reset idleTicks: what the driver
	// reports to the task record (DESIGN.md step 1). It only grows.
	progress uint64
}

// Progress counts the attempt's progress so far: every event that reset
// its stall count (an acknowledged block, the answer, the handoff's
// acknowledgement...). It only grows, so a driver that sees it move knows
// the attempt is alive, whatever its age (DESIGN.md step 1).
func (c *side) Progress() uint64 { return c.progress }

// progressed notes progress: the stall count starts again.
func (c *side) progressed() {
	c.idleTicks = 0
	c.progress++
}

// State returns the attempt's state.
func (c *side) State() State { return c.state }

// Err returns why the attempt aborted, or nil.
func (c *side) Err() error {
	if c.err == nil {
		return nil
	}
	return c.err
}

// Outbox returns the messages to send, in order, and forgets them.
func (c *side) Outbox() []wire.Message {
	out := c.out
	c.out = nil
	return out
}

func (c *side) send(m wire.Message) {
	c.out = append(c.out, m)
	c.quietTick = 0
}

func (c *side) move(to State) { c.moves.move(&c.state, to, c.name) }

// admit runs the checks every message meets before its handler and reports
// whether to handle it; if not, the error is what to tell the driver. An
// ended attempt takes nothing; a lower epoch is dropped and counted; a
// higher one means this attempt is superseded, and abort ends it.
func (c *side) admit(m wire.Message, abort func(wire.AbortReason, string, bool)) (bool, error) {
	if c.state == StateAborted {
		return false, ErrAborted
	}
	superseded, err := checkHeader(c.header, m)
	if c.state.Final() {
		// Done or live: late acks and heartbeats of this attempt are
		// harmless, but a superseded attempt's message is still refused
		// and counted.
		if errors.Is(err, ErrStaleEpoch) {
			c.m.StaleRejected++
			return false, err
		}
		return false, nil
	}
	if err != nil {
		if errors.Is(err, ErrStaleEpoch) {
			c.m.StaleRejected++
		}
		return false, err
	}
	if superseded {
		abort(wire.AbortStaleEpoch, fmt.Sprintf("superseded by epoch %d", m.Header().Epoch), false)
		return false, c.Err()
	}
	return true, nil
}

// recordAbort records why the attempt ends and tells the peer, unless the
// abort came from the peer. It reports false if the attempt had already
// ended, and the caller then does nothing more.
func (c *side) recordAbort(reason wire.AbortReason, text string, remote bool) bool {
	if c.state.Final() {
		return false
	}
	c.err = &AbortError{Reason: reason, Text: text, Remote: remote}
	if !remote {
		c.send(&wire.Abort{MsgHeader: c.header, Reason: reason, Text: text})
	}
	return true
}

// countTick counts one tick, sends a heartbeat when nothing was sent for
// heartbeatTicks, and reports whether the attempt went more than
// stallTicksMax ticks without progress.
func (c *side) countTick(stallTicksMax, heartbeatTicks int) (stalled bool) {
	c.tick++
	c.idleTicks++
	if c.idleTicks > stallTicksMax {
		return true
	}
	c.quietTick++
	if c.quietTick >= heartbeatTicks {
		c.send(&wire.Heartbeat{MsgHeader: c.header, Tick: c.tick})
	}
	return false
}

// stallText says why a stalled attempt aborts.
func (c *side) stallText() string {
	return fmt.Sprintf("no progress for %d ticks in state %s", c.idleTicks-1, c.state)
}
