package recovery

import (
	"fmt"

	"github.com/rejoin-db/rejoin/cow"
	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// SourceConfig sets one source attempt's identity and limits. Times are in
// ticks, which the driver maps to wall time.
type SourceConfig struct {
	// Header is the attempt's fencing epoch and partition; every message
	// sent carries it.
	Header wire.MsgHeader
	// WindowBlocksMax bounds the blocks sent and not yet acknowledged.
	WindowBlocksMax int
	// StallTicksMax: an attempt that makes no progress for this long aborts
	// (DESIGN.md step 8). What counts as progress depends on the state; see
	// Source.Tick.
	StallTicksMax int
	// HeartbeatTicks: send a heartbeat when nothing else was sent for this
	// long, so the peer's stall detection hears that we are alive.
	HeartbeatTicks int
	// HandoffLogBytesMax: a catch-up round that ends with the change log at
	// or below this size is followed by the handoff. It bounds the final
	// delta, and so the moment the source holds execution.
	HandoffLogBytesMax int
	// PumpBlocksMax bounds the blocks one Pump cuts (0: as many as the
	// window takes). Pump runs between two txns on the replica's own
	// goroutine, so a pump that fills a window of 16 blocks of 256 KiB
	// holds the partition's next txn for as long as cutting 4 MiB takes
	// (4 to 14 ms measured at a stream's start). With a bound, a pump that
	// stops at it leaves Pending set, and the driver pumps again (Step)
	// before it waits for anything, after the txns and messages that came
	// meanwhile.
	PumpBlocksMax int
	// RoundsMax bounds the catch-up rounds: after this many the handoff
	// comes whatever the log's size, so a rejoin never loops in catch-up.
	// The final delta is then bounded by the change log's own bound.
	RoundsMax int
	// Stream configures the table stream and its change log.
	Stream cow.Config
}

// DefaultSourceConfig returns limits that suit a node: windows of 16
// blocks of 256 KiB cut one a pump, a stall window of 100 ticks, handoff
// under 16 KiB of log or after 16 rounds. The log counts 4 bytes per
// dirty slot, so 16 KiB is a final delta of up to about 4k rows: a pause
// of a few milliseconds (256 KiB let it reach 64k rows and tens of
// milliseconds).
func DefaultSourceConfig(h wire.MsgHeader) SourceConfig {
	return SourceConfig{
		Header:             h,
		WindowBlocksMax:    16,
		PumpBlocksMax:      1,
		StallTicksMax:      100,
		HeartbeatTicks:     10,
		HandoffLogBytesMax: 16 << 10,
		RoundsMax:          16,
		Stream:             cow.DefaultConfig(),
	}
}

// Validate checks every limit.
func (c SourceConfig) Validate() error {
	switch {
	case c.WindowBlocksMax < 1:
		return fmt.Errorf("%w: WindowBlocksMax %d, want >= 1", ErrConfig, c.WindowBlocksMax)
	case c.PumpBlocksMax < 0:
		return fmt.Errorf("%w: PumpBlocksMax %d, want >= 0", ErrConfig, c.PumpBlocksMax)
	case c.StallTicksMax < 1:
		return fmt.Errorf("%w: StallTicksMax %d, want >= 1", ErrConfig, c.StallTicksMax)
	case c.HeartbeatTicks < 1 || c.HeartbeatTicks >= c.StallTicksMax:
		return fmt.Errorf("%w: HeartbeatTicks %d, want 1..%d (below StallTicksMax)", ErrConfig, c.HeartbeatTicks, c.StallTicksMax-1)
	case c.HandoffLogBytesMax < 0:
		return fmt.Errorf("%w: HandoffLogBytesMax %d, want >= 0", ErrConfig, c.HandoffLogBytesMax)
	case c.RoundsMax < 1:
		return fmt.Errorf("%w: RoundsMax %d, want >= 1", ErrConfig, c.RoundsMax)
	}
	if err := c.Stream.Validate(); err != nil {
		return fmt.Errorf("%w: stream: %w", ErrConfig, err)
	}
	return nil
}

// Source is the RecoverySourceProcessor: the source side of one rejoin
// attempt, on the live replica the partition is copied from. It answers
// the destination's proposal, activates the table stream at the boundary
// S, ships the snapshot and the catch-up rounds under the window, hands
// off at E, and is done only when the destination acknowledges the
// handoff: live at E with the same digest (DESIGN.md step 7).
//
// It is a state machine with no I/O and no clock: the driver feeds it the
// peer's messages (OnMessage) and ticks (Tick), calls Pump between two
// transactions of the store, and sends what Outbox returns, in order. A
// Block's Tuples stay valid until the block is acknowledged; the driver
// must have sent (or copied) it by then. It reaches the replica only
// through its SourceStore, and is the store's gate while the attempt
// runs, which is how it activates exactly at S, throttles, and holds the
// replica for the handoff. Like the store, it belongs to the goroutine
// that runs the store's txns.
//
// Invariants: at most WindowBlocksMax blocks are unacknowledged; blocks
// carry consecutive sequence numbers from 1; once the Handoff is sent, and
// whenever the attempt ends, the stream is deactivated and the gate
// removed, so the source partition is as it would be without the attempt
// (it executes on while the HandoffAck is awaited); StateDone is reached
// only by a HandoffAck that names the E and the digest handed off.
type Source struct {
	side
	cfg    SourceConfig
	store  SourceStore
	stream TableStream // nil until activated
	// rounds counts the catch-up rounds started, the final delta
	// included; final is set once the final delta is started.
	rounds int
	final  bool
	// s is the agreed boundary S; valid from StateAwaitingBoundary.
	s txnid.ID
	// sent is the Seq of the last block sent, acked the highest Seq
	// acknowledged. Invariant: acked <= sent <= acked + WindowBlocksMax.
	sent, acked uint64

	lastSafe txnid.ID // while awaiting S: the safe txn ID last seen
	holdTick uint64   // when the handoff hold began

	p txnid.ID // the proposal answered, to recognise it resent
	// rows is the store's row count when it answered, which every Answer
	// carries as the destination's sizing hint (docs/DESIGN.md, "Sizing
	// the destination").
	rows uint64
	// peerHold: the destination's buffer passed its hold mark (wire.Hold);
	// from then on no txn runs while the source streams.
	peerHold bool
	// blocks holds the last WindowBlocksMax+1 blocks sent, by Seq like
	// bufs, so every unacknowledged block can be sent again on a new
	// connection (Resume).
	blocks []*wire.Block
	// handoff is the Handoff once sent: for Resume, and to check the
	// HandoffAck against. From then on the source awaits that ack in
	// StateHandingOff, with the stream and the gate released.
	handoff  *wire.Handoff
	released bool // the stream is deactivated and the gate removed
	// pending: the last Pump stopped at PumpBlocksMax (Pending).
	pending bool

	// bufs are WindowBlocksMax+1 block buffers, used in turn by Seq. Block
	// Seq n reuses the buffer of block n-WindowBlocksMax-1, which the
	// window guarantees is acknowledged, so the driver has long sent it.
	// Growing a fresh buffer per block cost more than cutting the block.
	bufs [][]byte
}

// blockBuf returns the empty buffer for block seq.
func (s *Source) blockBuf(seq uint64) []byte {
	if s.bufs == nil {
		s.bufs = make([][]byte, s.cfg.WindowBlocksMax+1)
		s.blocks = make([]*wire.Block, s.cfg.WindowBlocksMax+1)
	}
	i := seq % uint64(len(s.bufs))
	if s.bufs[i] == nil {
		// Room for a full block plus its header and one tuple of slack.
		s.bufs[i] = make([]byte, 0, s.cfg.Stream.BlockBytesMax+4096)
	}
	return s.bufs[i][:0]
}

// NewSource starts a source attempt on exec's partition and installs itself
// as exec's gate. One attempt per source executor at a time.
func NewSource(exec *partition.Executor, cfg SourceConfig) (*Source, error) {
	return NewSourceOn(NewPartitionStore(exec), cfg)
}

// NewSourceOn starts a source attempt on store and installs itself as the
// store's gate. One attempt per store at a time.
func NewSourceOn(store SourceStore, cfg SourceConfig) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Source{
		side:  side{name: "source", header: cfg.Header, moves: sourceMoves, state: StateAnswering},
		cfg:   cfg,
		store: store,
	}
	store.SetGate(s)
	return s, nil
}

// Boundary returns the agreed S (Zero before the answer).
func (s *Source) Boundary() txnid.ID { return s.s }

// Metrics returns what the attempt did so far.
func (s *Source) Metrics() Metrics {
	m := s.m
	m.Rounds = s.rounds
	if st, ok := s.stream.(interface{ Metrics() cow.Metrics }); ok {
		sm := st.Metrics()
		m.Stream = sm
		m.LogBytesPeak = sm.LogBytesPeak
		m.ThrottledTicks = sm.ThrottledTicks
	}
	return m
}

// BeforeTxn implements partition.Gate. Before S it lets everything run; the
// txn at S activates the stream first (every txn below S has run, so the
// store is at the boundary); from then on the stream's throttle decides,
// unless the destination asked for a hold (wire.Hold), and everything is
// held during the handoff. A hold before S waits for S: the txns below it
// must run for the stream to start at all.
func (s *Source) BeforeTxn(next txnid.ID) bool {
	switch s.state {
	case StateAwaitingBoundary:
		if next < s.s {
			return true
		}
		s.activate()
		if s.state != StateStreaming || s.peerHold {
			return false
		}
		return s.stream.BeforeTxn(next)
	case StateStreaming, StateCatchingUp:
		if s.peerHold {
			// The stream closes the last txn's account at its next entry
			// (Pump or Tick), so skipping it here loses nothing.
			return false
		}
		return s.stream.BeforeTxn(next)
	case StateHandingOff:
		if s.released {
			return true // awaiting the HandoffAck; the gate is gone anyway
		}
		// From the final delta to the handoff the replica stands still at
		// E, whatever the store's stream would say; it is still asked, for
		// its account of the txns it held.
		s.stream.BeforeTxn(next)
		return false
	}
	return true
}

// OnMessage handles one message from the destination. The error says why
// a message was refused; an error that ends the attempt also shows in
// State and Err.
func (s *Source) OnMessage(m wire.Message) error {
	if ok, err := s.admit(m, s.abort); !ok {
		return err
	}
	switch m := m.(type) {
	case *wire.Propose:
		return s.onPropose(m)
	case *wire.Ack:
		return s.onAck(m)
	case *wire.HandoffAck:
		return s.onHandoffAck(m)
	case *wire.Abort:
		s.abort(m.Reason, m.Text, true)
		return s.Err()
	case *wire.Heartbeat:
		// With nothing outstanding, the peer's heartbeat is as much as it
		// can say. Once the handoff is sent, only its ack will do: a
		// destination that never got the Handoff heartbeats on, and must
		// not keep this attempt alive.
		if s.sent == s.acked && s.state != StateAwaitingBoundary && s.handoff == nil {
			s.progressed()
		}
		return nil
	case *wire.Hold:
		// Held until the handoff: the destination's buffer drains only
		// then. The stream goes on, and with no txn running the change
		// log stops growing, so the rounds end sooner.
		s.peerHold = true
		return nil
	}
	return s.protocol("unexpected %s in state %s", m.Type(), s.state)
}

func (s *Source) protocol(format string, args ...any) error {
	s.abort(wire.AbortProtocol, fmt.Sprintf(format, args...), false)
	return s.Err()
}

func (s *Source) onPropose(m *wire.Propose) error {
	if s.state != StateAnswering {
		if m.TxnID == s.p {
			// The destination resent its proposal on a new connection:
			// the answer stands.
			s.sendAnswer()
			return nil
		}
		return s.protocol("proposal in state %s", s.state)
	}
	s.p = m.TxnID
	s.s = Answer(s.store, m.TxnID)
	s.rows = s.store.Rows()
	s.move(StateAwaitingBoundary)
	s.progressed()
	s.lastSafe, _ = s.store.Safe()
	s.sendAnswer()
	s.Pump()
	return nil
}

func (s *Source) sendAnswer() {
	s.send(&wire.Answer{MsgHeader: s.header, TxnID: s.s, Rows: s.rows})
}

func (s *Source) onAck(m *wire.Ack) error {
	if m.Seq > s.sent {
		return s.protocol("ack of block %d, only %d sent", m.Seq, s.sent)
	}
	if m.Seq > s.acked {
		s.acked = m.Seq
		s.progressed()
	}
	s.Pump()
	return nil
}

// onHandoffAck ends the attempt: the destination is live at E with the
// digest handed off. An ack that names another E or digest is a replica
// live with other content than the source's: the attempt fails, loudly
// (DESIGN.md step 7).
func (s *Source) onHandoffAck(m *wire.HandoffAck) error {
	if s.handoff == nil {
		return s.protocol("handoff ack in state %s, no handoff sent", s.state)
	}
	if m.TxnID != s.handoff.TxnID || m.Digest != s.handoff.Digest {
		s.abort(wire.AbortDigestMismatch, fmt.Sprintf("destination live at %v with digest %016x; handed off at %v with %016x",
			m.TxnID, m.Digest, s.handoff.TxnID, s.handoff.Digest), false)
		return s.Err()
	}
	s.progressed()
	s.move(StateDone)
	return nil
}

// activate starts the table stream at the boundary S.
func (s *Source) activate() {
	if !AtBoundary(s.store, s.s) {
		// The store asked about a txn >= S while a txn < S may still
		// come: it cannot, the txn asked about is ready, so the safe txn
		// ID is past S. Reaching here is a bug.
		panic(fmt.Sprintf("recovery: source asked to run %v before reaching the boundary", s.s))
	}
	st, err := s.store.Activate(s.cfg.Stream)
	if err != nil {
		s.abort(wire.AbortInternal, "activate table stream: "+err.Error(), false)
		return
	}
	s.stream = st
	s.move(StateStreaming)
	s.progressed()
}

// Pump does what the source can do now, between two transactions: reach
// the boundary when only heartbeats flow, ship blocks while the window has
// room, start catch-up rounds, and hand off. The driver calls it after
// every txn the store runs and every message, and when idle.
//
// It cuts at most PumpBlocksMax blocks; one that stops there sets Pending.
// The bound is for the txns that could run between two pumps: none can
// from the final delta to the handoff, or under the destination's hold,
// so there the pump cuts what the window takes, and the pause the hold
// costs the writes is no longer for it.
func (s *Source) Pump() {
	s.pending = false
	if s.state == StateAwaitingBoundary && AtBoundary(s.store, s.s) {
		s.activate()
	}
	cut := 0
	for !s.state.Final() && s.state != StateAnswering && s.state != StateAwaitingBoundary && s.handoff == nil {
		if s.sent-s.acked >= uint64(s.cfg.WindowBlocksMax) {
			return
		}
		if s.cfg.PumpBlocksMax > 0 && cut >= s.cfg.PumpBlocksMax && !s.final && !s.peerHold {
			s.pending = true
			return
		}
		b, ok := s.stream.NextBlock(s.blockBuf(s.sent + 1))
		if ok {
			s.sendBlock(b)
			cut++
			continue
		}
		if !s.advance() {
			return
		}
	}
}

// advance moves the stream on once the part in flight is all cut
// (TableStream.NextBlock): from the snapshot to catch-up, from one round
// to the next, into the handoff, and out of it. It reports whether there
// may be more to do at once.
func (s *Source) advance() bool {
	if s.final {
		s.finishHandoff()
		return false
	}
	if s.state == StateStreaming {
		s.move(StateCatchingUp)
	}
	// Rounds repeat while the log is above the handoff size, and RoundsMax
	// ends the loop whatever happens. The next round starts here, the
	// moment the last one is shipped, which is what the stream's round
	// budget needs to guarantee that each round is at most half the last
	// plus one txn's log bytes (docs/DESIGN.md, "Catch-up convergence"):
	// the rounds shrink whatever the write rate.
	if s.stream.LogBytes() <= s.cfg.HandoffLogBytesMax || s.rounds >= s.cfg.RoundsMax {
		return s.beginHandoff()
	}
	if err := s.stream.StartRound(); err != nil {
		s.abort(wire.AbortInternal, "start round: "+err.Error(), false)
		return false
	}
	s.rounds++
	return true
}

func (s *Source) beginHandoff() bool {
	if err := s.stream.FinalDelta(); err != nil {
		s.abort(wire.AbortInternal, "final delta: "+err.Error(), false)
		return false
	}
	s.rounds++
	s.final = true
	s.move(StateHandingOff)
	s.holdTick = s.tick
	return true
}

// finishHandoff hands off at E: every txn < E has executed at the source
// and none >= E (it holds execution), and every block that brings the
// destination there is sent. The source executes on at once; the attempt
// stays handing-off until the destination's HandoffAck (onHandoffAck), or
// aborts if none comes within the stall window.
func (s *Source) finishHandoff() {
	e := max(s.s, s.store.LastExecuted()+1)
	s.handoff = &wire.Handoff{MsgHeader: s.header, TxnID: e, Digest: s.store.Digest(), LastSeq: s.sent, Rows: s.store.Rows(),
		Initiators: s.store.Initiators()}
	s.send(s.handoff)
	s.m.HandoffPauseTicks = s.tick - s.holdTick
	s.release()
}

// HoldsPartition reports whether the source keeps its replica from
// executing now: under the destination's hold (wire.Hold) while it
// streams, or from the final delta until the Handoff is sent. The
// destination needs it, and only while it can hear from the source: a
// driver whose connection to the destination broke ends the attempt
// rather than hold the partition's writes for as long as it tries to
// resume (supervise.Holding's BrokenHoldMax).
func (s *Source) HoldsPartition() bool {
	switch s.state {
	case StateAwaitingBoundary, StateStreaming, StateCatchingUp:
		return s.peerHold
	case StateHandingOff:
		return !s.released
	}
	return false
}

// Pending reports whether the last Pump stopped at PumpBlocksMax with the
// window open: the driver pumps again before it waits for an event, or
// the stream would move a block per event. It may find nothing left to
// cut; that costs one call.
func (s *Source) Pending() bool { return s.pending && !s.state.Final() && s.handoff == nil }

// HandoffSent reports whether the Handoff is sent: from then on the source
// executes again and awaits the destination's HandoffAck.
func (s *Source) HandoffSent() bool { return s.handoff != nil }

func (s *Source) sendBlock(b cow.Block) {
	s.sent++
	s.bufs[s.sent%uint64(len(s.bufs))] = b.Tuples[:0] // keep what the block grew to
	s.m.addBlock(b.Kind, b.Count, len(b.Tuples))
	m := &wire.Block{
		MsgHeader: s.header,
		Kind:      b.Kind,
		Table:     uint32(b.Table),
		Seq:       s.sent,
		Count:     b.Count,
		Tuples:    b.Tuples,
	}
	s.blocks[s.sent%uint64(len(s.blocks))] = m
	s.send(m)
}

// Resume sends again, for a new connection after the old one broke, what
// the destination may have lost with it: the answer, every block not yet
// acknowledged (at most one window, still held in the block ring), and the
// handoff once sent. The destination drops what it already has, so
// resuming costs at most one window of blocks, never a restart.
func (s *Source) Resume() {
	switch s.state {
	case StateAnswering, StateAborted:
		return // nothing sent yet, or nothing to resume
	}
	s.sendAnswer()
	for seq := s.acked + 1; seq <= s.sent; seq++ {
		s.send(s.blocks[seq%uint64(len(s.blocks))])
		s.m.BlocksResent++
	}
	if s.handoff != nil {
		s.send(s.handoff)
	}
	s.progressed()
}

// Tick advances the attempt's clock by one tick: throttle windows, the
// heartbeat, and stall detection. Progress, which resets the stall count,
// is: any message from the peer while waiting for its proposal, the safe
// txn ID moving while executing up to S, and an acknowledgement (or the
// peer's heartbeat with nothing outstanding) while streaming; once the
// Handoff is sent, an acknowledgement only, of a block or of the handoff.
// So a lost Handoff, or a destination that never goes live, ends the
// attempt after the stall window instead of leaving it done.
func (s *Source) Tick() {
	if s.state.Final() {
		return
	}
	if s.stream != nil && !s.released {
		s.stream.Tick()
	}
	if s.peerHold && (s.state == StateStreaming || s.state == StateCatchingUp) {
		s.m.PeerHoldTicks++
	}
	if s.state == StateAwaitingBoundary {
		if safe, ok := s.store.Safe(); ok && safe != s.lastSafe {
			s.lastSafe = safe
			s.progressed()
		}
	}
	if s.countTick(s.cfg.StallTicksMax, s.cfg.HeartbeatTicks) {
		s.abort(wire.AbortTimeout, s.stallText(), false)
		return
	}
	s.Pump()
}

// Abort ends the attempt from outside: a node of the partition failed, the
// claim was lost, the node shuts down.
func (s *Source) Abort(reason wire.AbortReason, text string) {
	s.abort(reason, text, false)
}

func (s *Source) abort(reason wire.AbortReason, text string, remote bool) {
	if !s.recordAbort(reason, text, remote) {
		return
	}
	s.release()
	s.move(StateAborted)
}

// release gives the store back: no stream, no gate. The deactivated
// stream stays referenced for its metrics. It runs once: after the
// handoff the gate may already be another attempt's.
func (s *Source) release() {
	if s.released {
		return
	}
	s.released = true
	if s.stream != nil {
		s.stream.Deactivate()
	}
	s.store.SetGate(nil)
}
