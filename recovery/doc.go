// Package recovery holds the rejoin protocol: the handshake that agrees on
// the txn ID S where streaming starts, and the RecoverySource and
// RecoveryDestination processors (DESIGN.md steps 2 to 8). Its subpackages
// hold the rest: claim (one executor per rejoin, fencing epochs in etcd),
// nodestate (a node's durable record and startup recovery), sim (the
// seeded simulator that checks all of it).
//
// # Shape
//
// Source and Destination are state machines with no I/O, no goroutines and
// no clock: a driver feeds them messages (OnMessage), the partition's feed
// (Destination.OnTxn, OnHeartbeat) and ticks (Tick), calls Source.Pump
// between two transactions, and sends what Outbox returns. The source is
// also its store's partition.Gate, which is how it activates the table
// stream exactly at S, throttles, and holds the replica for the handoff.
//
//	destination  buffering ─► proposing ─► streaming ─► catching-up ─► handing-off ─► live
//	source       answering ─► awaiting-boundary ─► streaming ─► catching-up ─► handing-off ─► done
//	             (every state but the last ─► aborted)
//
// state.go holds the tables of legal moves; a move off the table panics.
//
// # The replica core
//
// Replica (replica.go) is one partition replica's core, modelled on raft's
// RawNode, and the one every driver runs: recovery/node's replica
// goroutine, the simulator's source and destination nodes. It owns the
// executor, the initiators heard, at most one source and one destination
// attempt, the fence (the highest destination epoch seen: CheckDestination
// is the one fence check), and one lifecycle enum with a table of legal
// moves, checked on every move:
//
//	needs-rejoin ─► rejoining ─► live ─► needs-rejoin
//	                    └──────────────────► needs-rejoin
//
// Inputs: the feed (OnTxn, OnHeartbeat, AddInitiator, RemoveInitiator),
// the attempts' starts, messages, resumes and aborts, Tick, Step, Fail.
// Outputs, taken by the driver: Results (a Done per txn run) and Outbox
// (messages for each attempt's peer, attempts ended, gone live, failed),
// in order. The rules it keeps: a txn or heartbeat the replica cannot take
// in fails a live replica, and ends a running destination attempt
// instead; the feed goes to the destination attempt while there is one
// (live included, which takes txns below E as heartbeats); a source
// attempt runs only on a live replica, and only a newer epoch of the same
// peer supersedes it; the source is pumped after every txn.
//
// # Store seams
//
// The processors reach the replica only through small interfaces
// (store.go; docs/DESIGN.md "Store seams"), so any store can rejoin
// through them:
//
//   - SourceStore: the order of its txns (SourceView: queued, safe, last
//     executed, ready), the initiators it may still run, a gate asked
//     before each txn (SetGate), a TableStream activated at S, and its
//     Digest and Rows.
//   - TableStream: NextBlock, StartRound, FinalDelta, LogBytes, and the
//     throttle (BeforeTxn, Tick) until Deactivate. *cow.Stream is one.
//   - DestinationStore: the queue the feed fills (Offer, Heartbeat,
//     AddInitiator, RemoveInitiator, ResetTo), SetGate, Clear, Reserve
//     for the source's row count, Apply of a block, and Digest and Rows
//     computed as the source's.
//   - Conn, for drivers: Send and Recv of wire messages in order;
//     *stream.Conn is the TCP one.
//
// PartitionStore adapts partition.Executor, its partition and cow to
// them; NewSource and NewDestination wrap their executor in one, and
// NewSourceOn and NewDestinationOn take any store. Example_embedding
// (example_store_test.go) is the shortest such store and driver;
// mapstore_test.go rejoins a fuller map-backed store through the same
// processors, over an in-memory Conn and over stream.Conn.
//
// # The protocol in brief
//
//   - The destination buffers the feed from the moment it joins and
//     proposes P, the maximum over initiators of the first ID heard from
//     each (Coverage says why not the first buffered txn). An initiator
//     whose feed opens while the attempt runs is added (AddInitiator):
//     the proposal, if still to come, waits for it too.
//   - The source answers S (Answer): the next queued txn >= P, or a point
//     past its safe txn ID and last executed txn, so heartbeats alone end
//     the handshake. It activates the stream when AtBoundary holds. The
//     answer carries the source's row count, and the destination sizes
//     its store for it (Reserve) before the first block: a hint, bounded
//     by the store, never checked.
//   - Snapshot blocks, then catch-up rounds, flow under a window of
//     WindowBlocksMax unacknowledged blocks, cut at most PumpBlocksMax a
//     pump (Source.Pending: the driver pumps again before it waits);
//     rounds end when the change log is at most HandoffLogBytesMax or
//     after RoundsMax.
//   - The source holds execution, ships the final delta, and hands off at
//     E = max(S, last executed + 1) with its digest and row count, then
//     executes on. The Handoff names the initiators the source may still
//     run a txn of. The destination goes live only with equal digests
//     and with every one of those, and every initiator it hears, heard
//     at or below E (Coverage.Covers; else it aborts, uncovered); it
//     drops its buffered txns below E, takes late feed txns below E as
//     heartbeats, and answers HandoffAck{E, digest}.
//   - The source is done only with that ack in hand, naming its E and
//     digest. A lost handoff (no ack within the stall window; the
//     destination's heartbeats do not count then), the destination's
//     abort (a digest mismatch) or an ack with another digest abort the
//     attempt, so the driver requeues the task instead of reporting it
//     done: a failed handoff is never a silent one.
//   - The destination's buffer is bounded in bytes (BufferBytesMax). Past
//     its hold mark it sends Hold, and the source runs no txn while it
//     streams, until the handoff: the partition's writes stop, not the
//     feed that carries every partition (docs/DESIGN.md "Bounds"). A txn
//     past the bound all the same is refused (ErrBufferFull) and aborts
//     the attempt.
//   - A broken connection is resumed (Resume on both sides) by resending
//     at most one window of blocks, the hold if one was asked, the
//     Handoff once sent, and the HandoffAck once live.
//   - Progress counts what resets a side's stall count; the driver
//     refreshes the task record when it moves, so a long rejoin that
//     makes progress is never taken for a dead one (DESIGN.md step 1).
//
// # The initiator core
//
// Initiator (initiator.go) is a node's initiator as a pure core: client
// calls, Dones, ticks, membership views and feed events (FeedOpened,
// FeedResumed, FeedAcked, DialFailed, FeedLost) in; txns and heartbeats
// per node, dials, closes
// (InitiatorIO) and replies out. It owns the txn ID generator, the calls
// in flight and whom each waits for, the heartbeat schedule in ticks (and
// the heartbeats another initiator asks for, BeatPast), and
// each feed's state (dialing until its floor is in, open, lost with its
// process and its log of what the node has not acknowledged, and the
// partitions missed while it had none). recovery/node,
// the simulator and the bench drive it. TailRepair (tailrepair.go) is the
// rule of a dead initiator's tail repair beside it: which peers a replica
// asks, and when the repair counts as failed.
//
// Settle (settle.go) is the settlement of a lost registration as a pure
// function: what a node knows when it registers again (whether its lease
// lapsed, its feeds in at the loss and now, the processes alive and
// registered meanwhile, what their feed hellos told since the outage
// began) in; keep the replicas, fail these partitions, or wait for a
// node's feed out (docs/DESIGN.md "Settling a lapse"). recovery/node and
// the simulator drive it.
//
// # Invariants
//
//   - Every message carries the attempt's fencing epoch; a lower one is
//     rejected (ErrStaleEpoch, counted), a higher one aborts the superseded
//     attempt. This, not a lease, keeps two executors from both writing.
//   - The destination holds every txn >= S of the initiators heard
//     before the proposal, and goes live only holding every txn >= E of
//     every initiator the source still runs; at activation the source
//     has executed exactly the txns < S.
//   - An initiator sequences a txn of a partition only with a feed to
//     every node its view has alive that holds a replica of it (Unfed,
//     feeds.go), so a replica never misses a txn it does not then fail
//     on (docs/DESIGN.md "Feeds that open late").
//   - An Initiator sends nothing on a feed before its floor is in, and
//     issues every ID after above it (docs/DESIGN.md "An initiator that
//     joins"); it answers a call only once no live replica it reached is
//     waited for.
//   - At most WindowBlocksMax blocks are unacknowledged; blocks are applied
//     exactly once, in Seq order.
//   - Every phase has a stall timeout. Every abort leaves the source as it
//     was before activation (no stream, no gate) and the destination empty.
//   - A digest mismatch at the handoff is a failed rejoin, never a live one,
//     and never a done one at the source.
package recovery
