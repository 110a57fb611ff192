package recovery

import (
	"context"

	"github.com/rejoin-db/rejoin/cow"
	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// The store seams (docs/DESIGN.md "Store seams"): what the Source and
// Destination processors need from the replica they stream from or
// rebuild, and what a driver needs from the connection between them. The
// processors reach the store only through these, so a store other than
// package partition's can rejoin through the same processors;
// PartitionStore is the one the node, the bench and the simulator run.
//
// Every call is made on the store's own goroutine (the one that runs its
// txns), between two txns, as partition.Executor's calls are.

// SourceStore is what a Source needs from the live replica it streams
// from: the order of its txns (SourceView), a gate asked before each of
// them, a table stream activated at the boundary S, and its content at
// the handoff.
//
// Contracts:
//   - SetGate installs g, which the store asks before every txn, with
//     every txn below it executed (partition.Gate); a txn g refuses does
//     not run until g lets it. nil removes the gate.
//   - Activate is called exactly at the boundary S (every txn < S
//     executed, none >= S). The stream it returns then hears every change
//     the store makes until its Deactivate, so that the snapshot plus the
//     rounds bring the destination to the store's content (TableStream).
//   - Digest and Rows describe the whole content; the Destination's store
//     computes them the same way, so two equal contents have equal
//     digests.
type SourceStore interface {
	SourceView
	// Initiators returns the initiators whose txns the store may still
	// run; the Handoff names them (Coverage.Covers).
	Initiators() []txnid.Initiator
	SetGate(g partition.Gate)
	Activate(cfg cow.Config) (TableStream, error)
	Digest() uint64
	Rows() uint64
}

// TableStream is a store's table stream from the boundary S on: the
// snapshot, then catch-up rounds of what changed behind it, then the
// final delta (DESIGN.md steps 4 to 7). *cow.Stream is package
// partition's.
//
// Contracts:
//   - NextBlock cuts the next block of the part in flight (the snapshot,
//     a round, the final delta), appending its tuples to dst, and returns
//     false only when that part is all cut. The Source calls StartRound
//     or FinalDelta after the snapshot or a round is cut, and after the
//     final delta nothing more. Blocks read the store's content when they
//     are cut. A block's Tuples are a canonical array header for Count
//     tuples in the wire tuple format, as wire.Block carries them; what
//     the tuples mean (rows, keys) is between the two stores, and the
//     processors never look inside.
//   - After the final delta is cut, a destination that applied every
//     block in order holds the store's content: every change made behind
//     the snapshot's cursor since S was shipped by a round or the final
//     delta. The Source holds every txn from FinalDelta until Deactivate,
//     so nothing changes in between.
//   - LogBytes is what the change log holds, not yet cut; the Source hands
//     off once a round ends with it at most SourceConfig.HandoffLogBytesMax.
//   - BeforeTxn is the stream's throttle, asked through the Source's gate
//     before each txn while the stream runs (a store with no throttle
//     returns true); Tick counts one tick for it.
//   - Deactivate ends the stream, however the attempt ends, and leaves the
//     store as it would be without it. The Source calls it once.
//
// A stream that also has a Metrics() cow.Metrics method reports it in
// Source.Metrics.
type TableStream interface {
	NextBlock(dst []byte) (cow.Block, bool)
	StartRound() error
	FinalDelta() error
	LogBytes() int
	BeforeTxn(next txnid.ID) bool
	Tick()
	Deactivate()
}

// DestinationStore is what a Destination needs from the replica it
// rebuilds: a queue the partition's feed fills (and the replica runs from
// once live), a gate, and the content the blocks build.
//
// Contracts:
//   - Offer queues a txn from the initiator named in its ID, to run in ID
//     order once no initiator can send a smaller one (Heartbeat,
//     AddInitiator, RemoveInitiator move that safe point, as
//     partition.Executor's do). A full queue is an error wrapping
//     partition.ErrQueueFull.
//   - SetGate as for SourceStore: the Destination holds every txn until it
//     goes live, and then removes its gate.
//   - Clear drops the content (not the schema), at the start and on an
//     abort; Apply writes one block, all of it or nothing, and applying a
//     block twice is harmless. Blocks come in the order the source's
//     TableStream cut them.
//   - ResetTo(E) makes the queue continue at E after the content was
//     brought to the state after every txn < E: it drops the queued txns
//     below E, takes none below E from then on, and returns how many it
//     dropped.
//   - Reserve(rows) is the source's row count when it answered
//     (wire.Answer.Rows), called once after Clear and before the first
//     block: a hint to size the content for the rows about to come. It
//     must not fail, must bound what it allocates whatever rows says, and
//     changes no content.
type DestinationStore interface {
	Offer(inv partition.Invocation) error
	Heartbeat(id txnid.ID) error
	AddInitiator(in txnid.Initiator)
	RemoveInitiator(in txnid.Initiator)
	ResetTo(e txnid.ID) int
	SetGate(g partition.Gate)
	Clear()
	Reserve(rows uint64)
	Apply(b cow.Block) error
	Digest() uint64
	Rows() uint64
}

// Conn is what a driver needs from the connection between a Source and a
// Destination: the processors are messages in, Outbox out, and a driver
// sends each message of the Outbox in order and hands each one received
// to OnMessage. *stream.Conn is the TCP one.
//
// Contracts: Send sends m or fails; messages arrive in the order sent,
// or not at all once the connection broke (the processors' Resume then
// sends again, on a new connection, what may be lost). Recv returns the
// next message, waiting for it, and an error once the connection ended.
// A received wire.Block's Tuples may alias the connection's buffer until
// the next Recv: Destination.OnMessage applies it before it returns.
type Conn interface {
	Send(ctx context.Context, m wire.Message) error
	Recv() (wire.Message, error)
}
