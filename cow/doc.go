// Package cow streams a partition's tables to a recovering replica while the
// partition keeps executing transactions (DESIGN.md steps 4 to 7): the
// source side cuts blocks of rows, the destination side applies them.
//
// # Who calls it
//
// The recovery source processor, on the partition's executor goroutine,
// between two transactions. There is no I/O, no goroutine and no clock
// here: the processor pulls blocks with NextBlock and sends them, starts
// rounds, calls Tick at its tick rate, and installs the Stream as the
// executor's gate (partition.Gate). The partition reports every change to
// the stream through partition.Observer, which Activate installs. On the
// destination, the recovery destination processor hands every received
// block to an Applier.
//
// # Source side
//
// Activate starts a Stream at a txn boundary S (every txn < S executed,
// none >= S). The stream then goes through these phases (Phase; the moves
// are checked against a table):
//
//	Snapshot ──► BetweenRounds ◄──► Round
//	                  │
//	                  ▼
//	                Final ──► Done
//
//	and every phase ──► Inactive (Deactivate)
//
// Snapshot. A cursor walks the tables in TableID order and each table's
// slots [0, SlotsLen()) with Table.AppendTuples, cutting snapshot blocks
// of at most Config.BlockBytesMax tuple bytes (at least one tuple each).
// A slot is behind the cursor when the snapshot has read it or will never
// read it: in a finished table every slot is behind, those beyond the
// SlotsLen it had when it finished included; in the table being walked,
// the slots below the cursor; in tables not started yet, none. When
// NextBlock finds nothing left, every slot of every table is behind.
//
// Change log. From S on, the stream logs what changes behind the cursor:
// an inserted or updated slot joins the dirty set (a set: a slot that
// changes ten times is shipped once, with its content at shipping time);
// a deleted row's primary key is appended to the deleted keys. A primary
// key change arrives from the partition as a delete of the old key and an
// insert of the same slot, so both are logged. A change ahead of the
// cursor needs no entry: the cursor reads it.
//
// Rounds. Between rounds, StartRound swaps the log out (new changes go to
// a fresh one) and NextBlock returns the round's delete blocks (key
// tuples), then its upsert blocks (the current tuple of each dirty slot
// still live, read when the block is cut). A logged delete whose key is
// live again when its block is cut is dropped: that key's live row
// reached, or will reach, the destination through the snapshot or the
// dirty set, possibly after the delete was logged, and the delete would
// remove it (the trap of DESIGN.md step 6). A delete of a row the
// destination never had is harmless, since it applies deletes by key.
//
// Handoff. FinalDelta starts the last round while the caller holds the
// executor at the handoff txn E; from then on the gate holds every txn
// and a change to the partition is a bug that panics. When NextBlock
// returns false the stream is Done: the destination, once it applied
// every block, holds exactly the partition's content, and the caller
// sends E and Partition.Digest.
//
// Deactivate ends the stream on success and on every abort: it removes
// the observer and frees the log. The stream never writes to the
// partition, so the partition is then as if there had been no stream.
//
// # Invariants
//
//   - Every slot behind the cursor that changed since S (or since its
//     entry was last cut into a block) is either in the dirty set or was
//     deleted and its key is logged. Blocks read rows when they are cut,
//     so with the destination applying blocks in order, after the final
//     delta it holds the source's rows at E.
//   - LogBytes counts 4 bytes per slot in a dirty set and, per deleted
//     key, the key's bytes plus a 4-byte offset: the log being filled plus
//     the part of the round in flight not cut yet. The dirty sets'
//     membership bitsets (one bit per slot up to the highest dirty one, per
//     table) are not counted: they are sized by the table, not by the
//     write rate.
//   - The log never exceeds Config.ChangeLogBytesMax as long as no txn adds
//     more than Config.ChangeLogTxnBytesMax, because the gate lets no txn
//     start while the log is above ChangeLogBytesMax -
//     ChangeLogTxnBytesMax. A txn that adds more is counted in
//     Metrics.TxnsOverReserve and may take the log past the bound by its
//     excess; it is never refused or failed for it.
//   - Throttling only slows the source; nothing in this package fails a
//     rejoin because the source is busy. Shipping blocks never waits for a
//     txn, so a caller that keeps cutting blocks and starting rounds always
//     drains the log and lifts a hold.
//   - Catch-up converges (docs/DESIGN.md, "Catch-up convergence"): with
//     R_k the log bytes round k starts with and T the most log bytes one
//     txn adds, R_{k+1} <= R_k/2 + T for a caller that starts each round
//     as soon as the last is shipped, whatever the block size, window and
//     write rate.
//
// # Throttle
//
// The Stream is the executor's gate. Before each txn (BeforeTxn) it holds
// while the log is above the hold mark (ChangeLogBytesMax -
// ChangeLogTxnBytesMax), and, while a catch-up round is in flight, while
// the log being filled is not empty and holds at least half of what that
// round started with (the round budget, RoundBudgetSpent): the round's
// end lifts it. The budget binds only when writes would fill more than
// half a round in the time the round takes to ship, and it is what makes
// the rounds shrink whatever the block size, window and write rate. At
// each Tick it compares, over the last
// ThrottleWindowTicks ticks, the bytes the log grew by with the bytes
// shipping drained; if it grew more and the log is above
// PaceLowWaterBytes, it paces: at most PaceTxnsPerTick txns per tick, until
// the log is at or below PaceLowWaterBytes. Everything is counted in
// ticks and events, so a seeded simulation replays it exactly.
//
// # Destination side
//
// Applier.Apply (or Apply) writes a block to the destination partition:
// snapshot and upsert rows with Table.UpsertTuples, delete keys with
// Table.DeleteKey (a missing key is no error), so a resent block is
// harmless. It checks the whole block first (kind, table, array header
// against Count, every tuple against the table's schema or key), so a bad
// block changes nothing and returns an error wrapping ErrBadBlock or
// ErrUnknownTable.
//
// Expensive self-checks of the stream's bookkeeping (verifyStream) run in
// the tests after every block; go test -tags invariants ./cow/ also has
// the partition verify itself after every executor txn.
package cow
