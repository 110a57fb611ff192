// Package txnid defines transaction IDs, the generator an initiator uses to
// assign them, and the tracker a partition replica uses to know which of them
// can no longer be overtaken.
//
// # Who calls it
//
// An initiator owns one Generator and stamps every client request it sends to
// a partition's replicas with Next(); when idle it sends heartbeats stamped by
// the same Generator, so a heartbeat is just an ID with no work attached. A
// partition replica owns one Tracker holding the initiators it hears from,
// feeds it every ID that arrives (txn or heartbeat) through Observe, and
// executes a queued txn T only once T <= Safe(). The rejoin handshake uses
// the same safe point to agree on the txn ID at which a snapshot starts.
//
// # Layout
//
// An ID is a uint64 whose fields, from the most significant bit down, are
//
//	63            22 21       10 9         0
//	+---------------+-----------+-----------+
//	|  millis (42)  | count (12)| init (10) |
//	+---------------+-----------+-----------+
//
// with these limits:
//
//   - millis: milliseconds since EpochUnixMillis (2026-01-01T00:00:00Z). 42
//     bits last about 139.4 years, up to MillisMax at 2165-05-15T07:35:11.103Z.
//   - count: per-initiator sequence within one millisecond, so one initiator
//     can issue IDsPerMillisMax (4096) IDs per millisecond, about 4 million a
//     second, before its logical time has to run ahead of its clock.
//   - init: the initiator that issued the ID, InitiatorsMax (1024) of them.
//     Putting it lowest makes IDs from different initiators distinct even
//     when their clocks and counters agree, and breaks ties between them in
//     a fixed order.
//
// Comparing two IDs as integers therefore compares (millis, count, init)
// lexicographically: the order is total and roughly follows wall time across
// the cluster. Millisecond resolution and 12 counter bits were chosen over,
// say, microseconds with fewer counter bits because a burst within one
// millisecond is the common case for an initiator, and 1024 initiators leave
// ample room for the cluster sizes this system targets.
//
// # Invariants
//
//   - IDs issued by one Generator strictly increase, whatever its clock does:
//     a clock that stalls or steps back leaves the generator on its last
//     millisecond, bumping the counter, and a full counter moves it to the
//     next millisecond, ahead of the clock, until the clock catches up.
//   - No Generator ever issues Zero, or any ID with millis and count both 0,
//     so Zero can stand for "nothing seen yet".
//   - For a Tracker, nothing <= Safe() can still arrive from a tracked
//     initiator, because Observe rejects any ID from an initiator that is not
//     above the last one it accepted from that initiator.
//
// A Generator only guarantees growth within its own lifetime. An initiator
// that restarts on a clock that stepped back must not resume below IDs it
// issued before; that is for its owner to ensure (by waiting out the gap or
// persisting a floor), not for this package.
package txnid
