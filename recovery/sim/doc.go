// Package sim is the rejoin protocol in one process: a seeded,
// deterministic simulator of one partition being rebuilt on a new replica
// while its transactions keep flowing, with the faults that can hit the
// rejoin on the way (TigerBeetle's VOPR and FoundationDB's simulation are
// the models; STYLE.md rule 14).
//
// # Who calls it
//
// Run(seed, Options) runs one seed and returns a Result: the knobs drawn,
// the first invariant violated (nil if none), counters of what the run
// exercised, and with Options.Trace a line per event. `rejoin sim` runs
// many seeds and prints, for every failing one, the command that replays
// it; the tests run a few hundred. A scenario script (testdata/scenarios,
// run by cockroachdb/datadriven) drives the same world one step at a time.
//
// # Determinism
//
// No goroutine, no wall clock, no map iteration that matters. A tick is
// the unit of time: the processors' Tick, the throttle and the stall
// windows count them, and the initiators' txnid clocks read one
// millisecond per tick plus their skew. All randomness comes from one
// math/rand/v2 PCG seeded by the seed: it draws the knobs, then the seeds
// of three streams, one for the workload (so the same seed sends the same
// txns at the same ticks whatever the knobs: the equivalence test relies
// on it), one for the network and the scheduler's choices, one for the
// fault plan. Running a seed twice gives the same trace byte for byte.
//
// # What it models
//
//   - One source replica, loaded with a few dozen to a few hundred rows of
//     one or two tables (kv with a bytes key, acct with a two-column key),
//     and an oracle replica that receives the whole feed at once and never
//     takes part in a rejoin.
//   - One to four initiators, each stamping txns and heartbeats with a
//     txnid.Generator on its own skewed (and now and then stepping) clock,
//     sending them to every replica of the partition over links that
//     deliver in order after random delays. The txns are the builtin
//     procedures (insert, upsert, update, delete, increment, transfer) and
//     a primary key change (rekey); increments and transfers are not
//     idempotent, so a txn run twice or never shows in the digest.
//   - The rejoin as attempts, each with its fencing epoch: a destination
//     processor on a fresh, empty replica that joins the feed when the
//     attempt starts (it receives only what is sent from then on), a
//     source processor on the source executor, and a connection between
//     them that carries real wire frames (FrameEncoder and FrameDecoder
//     with the run's codec: none, s2 or zstd), sometimes split across two
//     packets.
//   - The supervisor: after an attempt's destination side ends without
//     going live, it starts a new attempt with the next epoch after a
//     delay; its word reaches the source node later still, and the source
//     node supersedes an older source processor still running there before
//     it starts the new one. Half the attempts let the new destination's
//     first message reach the source node before that word: it is then
//     handed to the older processor first, which must end itself on
//     seeing the newer epoch.
//   - Faults, planned from the seed (at most Knobs.Faults, one per
//     attempt), each waiting for a phase (handshake, snapshot, catch-up,
//     handoff): an abort of either side (shutdown, claim lost), a node of
//     the partition failing (the destination aborts with AbortNodeFailed,
//     DESIGN.md step 8), a cut of the connection (what is in flight is
//     lost; each side is told after a delay and aborts, or is never told
//     and must time out), and a restart of the destination node (its
//     replica is gone). A cut side keeps running until it knows, and its
//     messages may take a late route to a newer attempt's processor, which
//     must reject them by epoch.
//   - The throttle: a quarter of the runs get a change log small enough
//     that the source holds and paces its execution.
//
// # What it does not model
//
// Several source replicas or a source that dies (so no reassignment to
// another source), initiators that fail or join, claims and their TTLs in
// a coordinator, a byte-stream transport (stream package) with its own
// flow control and keepalive, corrupted bytes (the wire package's fuzzers
// cover decoding), memory limits, or time spent executing: a txn takes no
// ticks. The destination's buffer is never full.
//
// # Invariants
//
// Checked on every run; a violation ends the seed with a *Violation
// naming its letter:
//
//	(a) when the destination goes live its content (running digest, digest
//	    recomputed from every row, row counts) equals what the simulator
//	    recorded of the source when it sent Handoff, E is a txn boundary at
//	    the source then, and the two replicas stay equal at every txn both
//	    have executed afterwards, to the end of the feed; the source stays
//	    equal to the oracle throughout;
//	(b) every source's change log peak stays within ChangeLogBytesMax (the
//	    workload never exceeds the per-txn reserve, so the bound is hard);
//	(c) the run ends live within Faults+1 attempts; every abort is
//	    explained by a fault or by the supervisor (a digest mismatch, a
//	    protocol or decode error or a stall with no fault is a bug); after
//	    every source attempt ends, the source executor has no gate and its
//	    partition no observer, and it runs all its safe point allows; every
//	    aborted destination replica is empty and runs nothing;
//	(d) no running processor accepts a message of a superseded epoch: it
//	    must return recovery.ErrStaleEpoch.
//
// A panic in the code under test is a failure of the seed too.
package sim
