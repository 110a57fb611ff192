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
//   - The coordinator (coordinator.go), the claims issue's model of etcd
//     for the run's one task: a claim key created only if absent, with a
//     lease of ClaimTTLTicks kept alive by keepalives, deleted when the
//     lease runs out or its holder releases it; a cluster-wide revision
//     raised by every write (a claim, a deletion, the task's completion),
//     and the claim's epoch is the revision that created it, so epochs
//     strictly grow (1, 3, 5, ... when every claim ends in a deletion).
//     The task's record (open, running, done; last epoch; claims made) is
//     all a supervisor knows after a failover. A completion is accepted
//     from any attempt; a second one is a duplicate and its replica is
//     dropped.
//   - Executors (executor.go): the claim lives with the rejoin's driver on
//     the destination node, one executor per attempt. It claims the task
//     before its destination processor sends anything and takes the
//     claim's epoch for the attempt; it keeps the lease alive every
//     KeepaliveTicks and checks the claim every ClaimWindowTicks (both at
//     most half the TTL), and at the first check that finds the claim gone
//     (or the task done by another attempt) it stops; with
//     Knobs.LeaseGuard it also stops as soon as its last successful
//     keepalive is a TTL old, before it does anything else. Stopping, it
//     aborts its
//     destination processor, which writes nothing more, and releases what
//     it still holds. It releases the claim when its processor ends; if
//     its node restarts it dies holding it, and the claim expires.
//   - The supervisor (supervisor.go): it starts an attempt whenever the
//     task is not done and has no claim (none yet, released, or expired),
//     after a delay; its word reaches the source node later still, and the
//     source node supersedes an older source processor still running there
//     before it starts the new one. Half the attempts let the new
//     destination's first message reach the source node before that word:
//     it is then handed to the older processor first, which must end
//     itself on seeing the newer epoch. The supervisor can die; a new
//     leader is elected after up to ElectionTicksMax ticks, has lost what
//     the old one planned, and carries on from the coordinator alone.
//   - Nodes run one processor per partition and side, and hand every
//     message to the one they run: once a newer attempt's processor runs
//     on a node, what an older attempt still sends there reaches the newer
//     one, which must reject it by its epoch.
//   - Faults, planned from the seed (at most Knobs.Faults, one per
//     attempt), each waiting for a phase (handshake, snapshot, catch-up,
//     handoff): an abort of either side (shutdown, claim lost), a node of
//     the partition failing (the destination aborts with AbortNodeFailed,
//     DESIGN.md step 8), a cut of the connection (what is in flight is
//     lost; each side is told after a delay and aborts, or is never told
//     and must time out), a restart of the destination node (its
//     replica is gone), a pause of the attempt's executor for longer than
//     the claim's TTL (its destination processor, its feed, its
//     keepalives and its checks freeze; the claim expires; the supervisor
//     starts a new attempt with a new claim; when the executor wakes its
//     late messages reach the new attempt's processors, and it stops at
//     its first check, within one window), and the supervisor's death
//     (at a phase, or just as an attempt ended and the task has no claim,
//     so the next attempt was in its memory alone). A cut side keeps running until it knows, and its
//     messages may take a late route to a newer attempt's processor, which
//     must reject them by epoch.
//   - The throttle: a quarter of the runs get a change log small enough
//     that the source holds and paces its execution; and wherever writes
//     outpace shipping during catch-up (one-row blocks, a window of one
//     block), the round budget holds it for part of each round, so the
//     rounds shrink (docs/DESIGN.md, "Catch-up convergence").
//
// # What it does not model
//
// Several source replicas or a source that dies (so no reassignment to
// another source), initiators that fail, initiators that join in a
// seeded run (a script's late initiator does: setup late=N, open-feed;
// its write keeps recovery/node's feed rule, recovery.Unfed), several
// tasks or executors competing for them (one task, one executor per attempt, and
// only the supervisor starts attempts), the coordinator's own failures
// (it never loses a write or stops answering: an executor cut off from it,
// which gives up after a window without a successful check, is not
// modeled), clock rate differences between an executor and the
// coordinator (a tick is a tick everywhere), the source side pausing (only
// the destination side's executor does), task records' timestamps and
// startup recovery (DESIGN.md step 10), a byte-stream transport (stream
// package) with its own flow control and keepalive, corrupted bytes (the
// wire package's fuzzers cover decoding), memory limits, or time spent
// executing: a txn takes no ticks. The destination's buffer is never
// full. The supervisor starts attempts on the one destination node only,
// and scenario scripts have no supervisor (they start attempts
// themselves).
//
// # Invariants
//
// Checked on every run ((e) only with claims: every seed, and the scripts
// that ask for them); a violation ends the seed with a *Violation
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
//	    must return recovery.ErrStaleEpoch (a paused executor's late
//	    messages included: Stats.PausedLate, PausedRejected);
//	(e) the claims: a write is a message other than Abort accepted
//	    (returned no error) by a running processor while its sender still
//	    ran. At each node the accepted writes never go back in epoch, so
//	    two executors that both believe they hold the claim (one frozen
//	    past its lease, one holding the new claim) never interleave their
//	    writes. An executor learns it lost its claim within one window of
//	    the loss, or of waking if it was frozen then, and after it stops
//	    its processor sends nothing but its Abort. The supervisor starts an
//	    attempt only when the task has no claim. At the end no claim is
//	    left and the task is done by the live attempt (a run ends only
//	    once the claim of an executor that died with its node has run out
//	    its lease: nobody gives it back). With
//	    Knobs.LeaseGuard (half the seeds: an executor also stops, before
//	    anything else, once its own reckoning of its lease has run out) no
//	    write is accepted, and no destination goes live, for an executor
//	    whose claim the coordinator no longer holds, and at no tick do two
//	    executors that both believe they hold the claim both write.
//	    Without it (the claims issue's model as written: stop at the next
//	    check) both can happen: an executor woken from a pause acts until
//	    its next check, a source processor that has not yet seen the newer
//	    epoch accepts its writes, at times in the same tick as (just
//	    before) the newer attempt's first (seeds 22398 and 34137), and its
//	    destination may go live (a duplicate completion, dropped). Those
//	    are counted (Stats.WritesAfterLoss, DualWriteTicks,
//	    DuplicateCompletions), not failed: epoch order is what protects
//	    the replicas there.
//
// A panic in the code under test is a failure of the seed too.
package sim
