package recovery

import (
	"errors"
	"fmt"

	"github.com/rejoin-db/rejoin/cow"
	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// DestinationConfig sets one destination attempt's identity and limits.
type DestinationConfig struct {
	// Header is the attempt's fencing epoch and partition.
	Header wire.MsgHeader
	// Initiators are the partition's initiators: the destination proposes
	// once it has heard from every one of them.
	Initiators []txnid.Initiator
	// StallTicksMax: an attempt that makes no progress for this long aborts.
	StallTicksMax int
	// HeartbeatTicks: send a heartbeat when nothing else was sent for this
	// long.
	HeartbeatTicks int
	// BufferBytesMax bounds the txns buffered until the handoff, counted
	// by TxnBytes (0: BufferBytesMaxDefault). A txn past it is refused
	// with ErrBufferFull and the attempt aborts (wire.AbortOverload): the
	// last resort, which the hold below is there to avoid.
	BufferBytesMax int64
	// BufferHoldBytes is the hold mark (0: half of BufferBytesMax). Past
	// it the destination sends wire.Hold and the source holds execution
	// of the partition while it streams, which stops the partition's
	// writes (docs/DESIGN.md "Bounds"). The room between the mark and
	// BufferBytesMax takes the partition's txns already in flight then.
	BufferHoldBytes int64
}

// Bounds of the destination's buffer.
const (
	// BufferBytesMaxDefault is BufferBytesMax when the config gives none.
	BufferBytesMaxDefault = 512 << 20
	// TxnOverheadBytes is what a buffered txn costs beyond its params and
	// procedure name: its Invocation in the store's queue.
	TxnOverheadBytes = 64
)

// TxnBytes is what inv costs in the destination's buffer.
func TxnBytes(inv partition.Invocation) int64 {
	return int64(len(inv.Params)+len(inv.Proc)) + TxnOverheadBytes
}

// Validate checks every limit.
func (c DestinationConfig) Validate() error {
	switch {
	case len(c.Initiators) == 0:
		return fmt.Errorf("%w: no initiators", ErrConfig)
	case c.StallTicksMax < 1:
		return fmt.Errorf("%w: StallTicksMax %d, want >= 1", ErrConfig, c.StallTicksMax)
	case c.HeartbeatTicks < 1 || c.HeartbeatTicks >= c.StallTicksMax:
		return fmt.Errorf("%w: HeartbeatTicks %d, want 1..%d (below StallTicksMax)", ErrConfig, c.HeartbeatTicks, c.StallTicksMax-1)
	case c.BufferBytesMax < 0:
		return fmt.Errorf("%w: BufferBytesMax %d, want >= 0", ErrConfig, c.BufferBytesMax)
	case c.BufferHoldBytes < 0 || c.BufferHoldBytes >= c.bufferBytesMax():
		return fmt.Errorf("%w: BufferHoldBytes %d, want 0..%d (below BufferBytesMax)", ErrConfig, c.BufferHoldBytes, c.bufferBytesMax()-1)
	}
	return nil
}

func (c DestinationConfig) bufferBytesMax() int64 {
	if c.BufferBytesMax == 0 {
		return BufferBytesMaxDefault
	}
	return c.BufferBytesMax
}

func (c DestinationConfig) bufferHoldBytes() int64 {
	if c.BufferHoldBytes == 0 {
		return c.bufferBytesMax() / 2
	}
	return c.BufferHoldBytes
}

// holdAll is the destination store's gate until it goes live: it
// buffers, it does not execute.
type holdAll struct{}

func (holdAll) BeforeTxn(txnid.ID) bool { return false }

// Destination is the RecoveryDestinationProcessor: the side of one rejoin
// attempt that rebuilds a partition replica. It buffers the partition's
// transaction feed from the start, proposes P, applies the snapshot and
// catch-up blocks in order, checks the digest at the handoff txn E, drops
// its buffered txns below E, lets its store run from E on, and tells
// the source so (HandoffAck): the rejoin is done only when the source has
// that acknowledgement (DESIGN.md step 7).
//
// Like Source it has no I/O and no clock. The driver feeds it the
// initiators' traffic (OnTxn, OnHeartbeat), the source's messages
// (OnMessage) and ticks, and sends what Outbox returns. It reaches the
// replica only through its DestinationStore.
//
// Invariants: the store is empty when the attempt starts and is emptied
// again if it aborts, so a failed attempt leaves nothing half built; the
// store runs no txn before the replica is live; blocks are applied exactly
// once, in Seq order; the replica goes live only with the source's digest
// at E.
type Destination struct {
	side
	cfg   DestinationConfig
	store DestinationStore
	cov   *Coverage

	p, s, e txnid.ID // proposed P, answered S, handoff E
	applied uint64   // Seq of the last block applied

	// buffered counts the bytes (TxnBytes) of the txns buffered while the
	// attempt runs. Invariant: buffered <= BufferBytesMax; holding is set
	// once buffered passed BufferBytesHold and the Hold went out.
	buffered int64
	holding  bool

	// ack is the HandoffAck sent on going live, kept so Resume can send it
	// again: the digest it carries is the one at E, which the partition
	// has left behind since.
	ack *wire.HandoffAck
}

// NewDestination starts a destination attempt on exec's partition: it
// empties the partition and holds the executor, which buffers from now on.
// The driver must already have added cfg.Initiators to exec.
func NewDestination(exec *partition.Executor, cfg DestinationConfig) (*Destination, error) {
	return NewDestinationOn(NewPartitionStore(exec), cfg)
}

// NewDestinationOn starts a destination attempt on store: it empties the
// store and holds it, so it buffers from now on. The driver must already
// have added cfg.Initiators to the store.
func NewDestinationOn(store DestinationStore, cfg DestinationConfig) (*Destination, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	store.Clear()
	store.SetGate(holdAll{})
	return &Destination{
		side:  side{name: "destination", header: cfg.Header, moves: destinationMoves, state: StateBuffering},
		cfg:   cfg,
		store: store,
		cov:   NewCoverage(cfg.Initiators),
	}, nil
}

// Proposal returns P (Zero before the proposal).
func (d *Destination) Proposal() txnid.ID { return d.p }

// Metrics returns what the attempt did so far.
func (d *Destination) Metrics() Metrics { return d.m }

// OnTxn buffers a transaction of the partition's feed. While the attempt
// runs, the store only queues it; after the handoff it runs in order.
// Past the hold mark the destination asks the source to hold (wire.Hold);
// a txn that would take the buffer past BufferBytesMax is refused with
// ErrBufferFull and aborts the attempt, as does a full queue in the store:
// a buffer missing a txn cannot go live.
func (d *Destination) OnTxn(inv partition.Invocation) error {
	if d.state == StateLive && inv.ID < d.e {
		// The feed lags the stream: this txn's effect came with the
		// snapshot. It still tells the safe point its initiator passed it.
		d.m.TxnsLate++
		return d.store.Heartbeat(inv.ID)
	}
	var cost int64
	if d.state != StateLive {
		cost = TxnBytes(inv)
		if limit := d.cfg.bufferBytesMax(); d.buffered+cost > limit {
			err := fmt.Errorf("%w: txn %v of %d bytes with %d buffered, BufferBytesMax %d", ErrBufferFull, inv.ID, cost, d.buffered, limit)
			if !d.state.Final() {
				d.abort(wire.AbortOverload, "transaction buffer full despite the hold: "+err.Error(), false)
			}
			return err
		}
	}
	if err := d.store.Offer(inv); err != nil {
		if errors.Is(err, partition.ErrQueueFull) && !d.state.Final() {
			d.abort(wire.AbortOverload, "transaction buffer full: "+err.Error(), false)
		}
		return err
	}
	d.buffered += cost
	d.m.BufferBytesPeak = max(d.m.BufferBytesPeak, d.buffered)
	d.maybeHold()
	d.observe(inv.ID)
	return nil
}

// maybeHold sends the Hold once the buffer is past its mark. The buffer
// drains only at the handoff, so the hold lasts until then: it stops the
// partition's writes and lets the stream finish, where the buffer's room
// would otherwise run out (docs/DESIGN.md "Bounds").
func (d *Destination) maybeHold() {
	if d.holding || d.state.Final() || d.buffered <= d.cfg.bufferHoldBytes() {
		return
	}
	d.holding = true
	d.send(&wire.Hold{MsgHeader: d.header})
}

// OnHeartbeat records an initiator's heartbeat.
func (d *Destination) OnHeartbeat(id txnid.ID) error {
	if err := d.store.Heartbeat(id); err != nil {
		return err
	}
	d.observe(id)
	return nil
}

func (d *Destination) observe(id txnid.ID) {
	d.cov.Observe(id)
	if d.state == StateBuffering {
		d.progressed()
		d.maybePropose()
	}
}

// AddInitiator: a feed from in opened while the attempt runs (or after
// it went live). The store tracks it from now on. Before the proposal,
// the proposal waits for it too; at the handoff the destination goes live
// only if it heard in at or below E (Coverage.Covers), since what in sent
// before its feed opened went to the source alone.
func (d *Destination) AddInitiator(in txnid.Initiator) {
	d.store.AddInitiator(in)
	if d.state != StateLive {
		d.cov.AddInitiator(in)
	}
}

// RemoveInitiator: the initiator's node died and sends nothing more. The
// store's safe point stops waiting for it, and so does the proposal if
// it is still to come.
func (d *Destination) RemoveInitiator(in txnid.Initiator) {
	d.cov.RemoveInitiator(in)
	d.store.RemoveInitiator(in)
	if d.state == StateBuffering {
		d.maybePropose()
	}
}

func (d *Destination) maybePropose() {
	p, err := d.cov.Proposal()
	if err != nil {
		return // not every initiator heard yet
	}
	d.p = p
	d.move(StateProposing)
	d.send(&wire.Propose{MsgHeader: d.header, TxnID: p})
}

// OnMessage handles one message from the source.
func (d *Destination) OnMessage(m wire.Message) error {
	if ok, err := d.admit(m, d.abort); !ok {
		return err
	}
	switch m := m.(type) {
	case *wire.Answer:
		return d.onAnswer(m)
	case *wire.Block:
		return d.onBlock(m)
	case *wire.Handoff:
		return d.onHandoff(m)
	case *wire.Abort:
		d.abort(m.Reason, m.Text, true)
		return d.Err()
	case *wire.Heartbeat:
		if d.state != StateBuffering {
			d.progressed()
		}
		return nil
	}
	return d.protocol("unexpected %s in state %s", m.Type(), d.state)
}

func (d *Destination) protocol(format string, args ...any) error {
	d.abort(wire.AbortProtocol, fmt.Sprintf(format, args...), false)
	return d.Err()
}

func (d *Destination) onAnswer(m *wire.Answer) error {
	if d.state != StateProposing {
		if m.TxnID == d.s && (d.state == StateStreaming || d.state == StateCatchingUp) {
			return nil // resent on a new connection: already agreed
		}
		return d.protocol("answer in state %s", d.state)
	}
	if m.TxnID < d.p {
		return d.protocol("answer %v below proposal %v", m.TxnID, d.p)
	}
	d.s = m.TxnID
	// Sized once, before the first block, rather than grown as the blocks
	// come. Only the first answer does: a resent one arrives with rows
	// already applied.
	d.store.Reserve(m.Rows)
	d.progressed()
	d.move(StateStreaming)
	return nil
}

func (d *Destination) onBlock(m *wire.Block) error {
	if d.state != StateStreaming && d.state != StateCatchingUp {
		return d.protocol("block %d in state %s", m.Seq, d.state)
	}
	switch {
	case m.Seq <= d.applied:
		// A resent block is already applied: acknowledge again, change
		// nothing.
		d.send(&wire.Ack{MsgHeader: d.header, Seq: d.applied})
		return nil
	case m.Seq != d.applied+1:
		return d.protocol("block %d after block %d", m.Seq, d.applied)
	}
	if m.Kind == wire.BlockSnapshot && d.state == StateCatchingUp {
		return d.protocol("snapshot block %d during catch-up", m.Seq)
	}
	if m.Kind != wire.BlockSnapshot && d.state == StateStreaming {
		d.move(StateCatchingUp)
	}
	b := cow.Block{Kind: m.Kind, Table: partition.TableID(m.Table), Count: m.Count, Tuples: m.Tuples}
	if err := d.store.Apply(b); err != nil {
		d.abort(wire.AbortDecodeError, fmt.Sprintf("block %d: %v", m.Seq, err), false)
		return d.Err()
	}
	d.applied = m.Seq
	d.progressed()
	d.m.addBlock(m.Kind, m.Count, len(m.Tuples))
	d.send(&wire.Ack{MsgHeader: d.header, Seq: m.Seq})
	return nil
}

func (d *Destination) onHandoff(m *wire.Handoff) error {
	if d.state != StateStreaming && d.state != StateCatchingUp {
		return d.protocol("handoff in state %s", d.state)
	}
	if m.LastSeq != d.applied {
		return d.protocol("handoff after block %d, applied %d", m.LastSeq, d.applied)
	}
	if m.TxnID < d.s {
		return d.protocol("handoff at %v below the boundary %v", m.TxnID, d.s)
	}
	if err := d.cov.Covers(m.TxnID, m.Initiators); err != nil {
		// What the source runs from E on must be in the buffer; a txn of
		// a late initiator below its first ID here is not (docs/DESIGN.md
		// "Feeds that open late"). A new attempt hears it from its start.
		d.abort(wire.AbortUncovered, err.Error(), false)
		return d.Err()
	}
	d.move(StateHandingOff)
	rows, got := d.store.Rows(), d.store.Digest()
	if got != m.Digest || rows != m.Rows {
		d.abort(wire.AbortDigestMismatch, fmt.Sprintf("at %v: digest %016x with %d rows, source has %016x with %d rows", m.TxnID, got, rows, m.Digest, m.Rows), false)
		return d.Err()
	}
	d.e = m.TxnID
	d.m.TxnsDropped = d.store.ResetTo(m.TxnID)
	// The buffer is the live replica's queue now, bounded as any.
	d.buffered = 0
	d.store.SetGate(nil)
	d.move(StateLive)
	d.ack = &wire.HandoffAck{MsgHeader: d.header, TxnID: m.TxnID, Digest: got}
	d.send(d.ack)
	return nil
}

// Resume sends again, for a new connection after the old one broke, what
// the source may have lost with it: the proposal, the last
// acknowledgement so the source learns at once how far it got, or, once
// live, the HandoffAck the source waits for to be done.
func (d *Destination) Resume() {
	switch d.state {
	case StateProposing:
		d.send(&wire.Propose{MsgHeader: d.header, TxnID: d.p})
	case StateStreaming, StateCatchingUp:
		d.send(&wire.Ack{MsgHeader: d.header, Seq: d.applied})
	case StateBuffering:
		if d.holding { // a hold asked before the proposal
			d.send(&wire.Hold{MsgHeader: d.header})
		}
		return
	case StateLive:
		d.send(d.ack)
		return
	default:
		return
	}
	if d.holding {
		d.send(&wire.Hold{MsgHeader: d.header})
	}
	d.progressed()
}

// Tick advances the attempt's clock: the heartbeat and stall detection.
// Progress is initiator traffic while buffering, and any message from the
// source after the proposal (the source heartbeats while it executes up to
// S; a block or an answer moves things on).
func (d *Destination) Tick() {
	if d.state.Final() {
		return
	}
	if d.countTick(d.cfg.StallTicksMax, d.cfg.HeartbeatTicks) {
		d.abort(wire.AbortTimeout, d.stallText(), false)
	}
}

// Abort ends the attempt from outside. With wire.AbortNodeFailed it is the
// "hara kiri" of DESIGN.md step 8: a node of the partition failed while the
// rejoin ran, so the destination drops what it built and lets the failure
// handling start afresh.
func (d *Destination) Abort(reason wire.AbortReason, text string) {
	d.abort(reason, text, false)
}

func (d *Destination) abort(reason wire.AbortReason, text string, remote bool) {
	if !d.recordAbort(reason, text, remote) {
		return
	}
	// Drop the partial replica; the store stays held, so nothing runs on
	// it. A new attempt starts from a new processor.
	d.store.Clear()
	d.move(StateAborted)
}
