// Package sim is the rejoin protocol in one process: a seeded,
// deterministic simulator of one partition being rebuilt on a new replica
// while its transactions keep flowing, with the faults that can hit the
// rejoin on the way (TigerBeetle's VOPR and FoundationDB's simulation are
// the models; docs/STYLE.md rule 14).
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
//   - Two live source replicas on nodes of their own (src and src2; a
//     script has one unless it asks), loaded with the same few dozen to a
//     few hundred rows of one or two tables (kv with a bytes key, acct
//     with a two-column key), and an oracle replica that receives the
//     whole feed at once and never takes part in a rejoin.
//   - One to four initiators, each the product's initiator core
//     (recovery.Initiator, initiator.go: the one recovery/node drives)
//     on its own skewed (and now and then stepping) clock: it stamps txns
//     and heartbeats, heartbeats after HeartbeatTicks idle ticks and,
//     in half the runs (Knobs.BeatAsks), when another initiator asks for
//     one above a txn it sequenced (Initiator.BeatPast), in half the
//     runs ahead of its clock once it has sequenced nothing for a while
//     (Knobs.BeatLeadTicks, as recovery/node's Config.BeatLead), opens
//     its feeds with their floors, joins the partition on each
//     (Knobs.Joins, on in every seeded run: a replica tracks it from its
//     join, whose answer carries the replica's floor), and sends each txn
//     only with a feed to every node holding a replica (recovery.Unfed)
//     that answered its join, to every replica of the partition over
//     links that deliver in order after random delays. Its calls have no
//     caller: nothing waits for their results. The txns are the builtin
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
//   - The nodes' replicas run the product's replica core
//     (recovery.Replica, docs/DESIGN.md "The replica core"), as
//     recovery/node's replica goroutine does: each source node's core owns
//     its executor and its source attempt (the feed, the step that pumps
//     the source after every txn, ticks, starts, aborts and messages go
//     through it), and the destination node's core holds its fence, its
//     attempts and, once live, the replica (a restart keeps the fence).
//     The simulator drains their outboxes after every call, as the node
//     does; a frozen holder's processor is the one thing it leaves out of
//     the core's step (the executor runs on, the processor does nothing).
//   - The coordinator (coordinator.go), the model of etcd under the
//     product's rules for the run's one task (the partition onto the
//     destination node): a claim key created only if absent, with its own
//     lease of ClaimTTLTicks kept alive by keepalives (a key deleted by a
//     reset or a revoke leaves its lease alive, as etcd's does); a
//     cluster-wide revision raised by every write, and the claim's epoch
//     is the revision that created it, so epochs strictly grow; the task's
//     record, a claim.Record moved only by claim's own record rules
//     (StartRecord, TouchRecord, RequeueRecord, DoneRecord, StaleReason and
//     ResetRecord), each holder's write compared with the claim key as
//     etcd's transactions do; the assignment (a supervise.Assignment,
//     written with a compare-and-swap on its revision); the nodes'
//     registrations and the placement. It can be down (an outage): it then
//     answers nothing and nothing in it moves; its leases get a whole TTL
//     again when it is back.
//   - The holder (holder.go): the claim is held on the source node, where
//     recovery/node holds it. Each source node's executor polls its
//     assignment; for a new one (or, ending a failed attempt, the same one
//     again after a delay) it acquires the claim (its epoch is the
//     attempt's), starts the task, and says hello to the destination over
//     the attempt's connection; the destination node takes the hello only
//     if the coordinator's claim stands at that epoch naming the source
//     node and the epoch is above every one it has seen (its durable
//     fence), as recovery/node's checkHolder does, supersedes the attempt
//     it runs, and answers; the source processor starts on the answer. The
//     holder then runs claim.Guard, the node's own guard: keepalives every
//     KeepaliveTicks, claim.ChecksPerWindow checks a ClaimWindowTicks
//     window, a touch of the task record when the attempt made progress
//     (at most once a window), and the claim lost at the first check that
//     finds it gone or after a window without an answered one; with
//     Knobs.LeaseGuard it also stops as soon as the guard no longer holds
//     the claim certainly, before it does anything else and before its
//     source sends anything. What the attempt does from the claim to its
//     release is decided by the node's own attempt core
//     (supervise.Holding, driven by holdDo as recovery/node's holdAttempt
//     drives it): start the task, say hello, start the source on the
//     answer, redial a broken connection for the grace and give up
//     sooner when the source holds its partition, abort the source when
//     the claim is lost, complete the task when the source is done (by
//     the HandoffAck) or requeue it, release the claim, and take the
//     assignment again after a failure. A live destination completes the
//     task too, and tries again until the coordinator takes it.
//   - The supervisor (supervisor.go) is supervise.Decide: every few ticks
//     it builds a supervise.Snapshot from the coordinator and applies the
//     actions Decide returns (Limits in ticks mapped to durations, a
//     millisecond a tick); the health task is supervise.CheckHealth on the
//     nodes and claim.StaleReason on the task (StaleTicks: the stall
//     window plus two claim windows, as the node sets it). The supervisor
//     can die; a new leader is elected after up to ElectionTicksMax ticks
//     and carries on from the coordinator alone.
//   - Nodes run one processor per partition and side, and hand every
//     message to the one they run: once a newer attempt's processor runs
//     on a node, what an older attempt still sends there reaches the newer
//     one, which must reject it by its epoch.
//   - Faults, planned from the seed (at most Knobs.Faults, one per
//     attempt), each waiting for a phase (handshake, snapshot, catch-up,
//     handoff): an abort of either side (shutdown, claim lost), a node of
//     the partition failing (the destination aborts with AbortNodeFailed,
//     DESIGN.md step 8), a cut of the connection (what is in flight is
//     lost; as recovery/node does, the destination keeps its attempt and
//     the source, once told, redials for Knobs.ResumeGraceTicks: a dial
//     that finds the destination running the same attempt resumes both
//     on a new connection, Source.Resume sending again what may have
//     been lost; past the grace the source aborts, and a side never told
//     times out; a script's cut instead aborts each side as it learns),
//     a restart of the destination node (its
//     replica is gone; its fence survives), a pause of the attempt's
//     holder on the source node for longer than the claim's TTL (its
//     guard, its source processor and its connection freeze, both ways;
//     the claim expires; the supervisor assigns the task again and the
//     source node starts a new attempt with a new claim, superseding the
//     frozen processor; when the holder wakes, what it had in flight
//     reaches the new attempt's processors, and its guard stops it; half
//     the pauses end just past the holder's lease, before a new attempt
//     starts), an outage of the coordinator (a third of them cut only
//     the attempt's source node off from it, while it runs on for the
//     others), the death of the attempt's
//     source node (its replica, processors and holder gone, releasing
//     nothing; its registration goes half a claim TTL later, and Decide
//     assigns the task to the other source, revoking the claim that still
//     stands), and the supervisor's death (at a phase, or just as an
//     attempt ended and the task has no claim).
//   - A source node that loses its registration while its process runs
//     on (registration.go; docs/DESIGN.md "Settling a lapse"), in one
//     run in four, drawn from a stream of its own so the other streams
//     draw as before: cut off from the coordinator, its lease lapses (its
//     record goes, the initiators' view drops it and keeps its feeds) or
//     not; an initiator's feed to it may break (and resume, or fail its
//     replica, as below); a new initiator process may register while it is
//     away and write with it out of its view, its feed there opening
//     late. Back, it registers again and settles by recovery.Settle, the
//     node's own rule, waiting boundedly for the feeds it asks for, and
//     takes no claim before (the node's settledTerm gate). A replica
//     kept is compared with the oracle again; one failed (or held, below)
//     is out of the run (its rejoin is not modelled). Half of them wait for the
//     destination to be live. In half the lapsing runs where a source
//     node dies, the loss waits for that
//     death and hits the survivor while no destination is live: the
//     only live replica, every txn meanwhile refused, kept by Settle's
//     rule 6 (the settlement is given the other replicas live
//     meanwhile, from the coordinator's records, as the node reads
//     etcd's history). As in the node's view, a replica counts live only
//     while its node is in the view.
//     A cut side keeps running until it knows, and its messages may take
//     a late route to a newer attempt's processor, which must reject them
//     by epoch.
//   - Feeds that break and resume (feedbreak.go; docs/DESIGN.md "Feeds
//     that resume"): in a lost registration, and in some runs
//     (Knobs.FeedBreaks) at any time, an initiator's feed to a source
//     node breaks, losing what is in flight either way; the node acks
//     what it read now and then and late (Knobs.FeedAckPct), so the
//     core's log is sometimes long. The node is out of reach for a while,
//     the core logging txns meanwhile; its redial asks to resume and is
//     answered by serveFeed's rule (takeUp): resumed at the last ID the
//     node read, the log above it resent, or refused and the replica
//     failed (or held, below), when a small log (Knobs.FeedLogBytesMax)
//     overflowed.
//   - The throttle: a quarter of the runs get a change log small enough
//     that the source holds and paces its execution; and wherever writes
//     outpace shipping during catch-up (one-row blocks, a window of one
//     block), the round budget holds it for part of each round, so the
//     rounds shrink (docs/DESIGN.md, "Catch-up convergence").
//   - A silent initiator fenced (silent.go; scripts only: silence,
//     fence): its process stops with its feeds open, its last txns
//     having reached some source replicas and not others, and every
//     replica holds. Taken for dead, each replica repairs its tail of it
//     from its live peers by the product's rules (recovery.TailRepair,
//     recovery.Tails) before it stops waiting for it; the oracle shows a
//     survivor left short.
//   - A replica held rather than failed (holds.go; docs/DESIGN.md
//     "Holding a partition"): wherever a source node's replica may lack
//     txns its partition acknowledged elsewhere (its lapse's settlement
//     fails it, a resumed feed's hello names the partition missed, a feed
//     is re-opened without resuming, its tail of a fenced initiator is
//     not repaired), the simulator calls recovery.Replica.Lose, as
//     recovery/node's lose does, telling it whether a replica on another
//     node is live in the view (its record live, its node's registration
//     standing, from the coordinator). With one it fails; with none it is
//     held: out of the run as a failed one is, its record needs-rejoin
//     and held, its rows kept. A run whose partition is left held with no
//     replica live ends there, and the oracle counts the txns the held
//     replica lacks that another replica ran (Stats.HeldLacking). The
//     fault plan keeps a source live wherever one may fail, so no seed
//     has held one yet: scenario hold.txt and lapse-settle.txt do.
//   - The fence's decision, apart (fencing.go, RunFencing,
//     TestFencingSeeds): three to seven nodes under isolations, links cut
//     one way or both, splits, bridges, pauses and kills report one
//     another, fence by supervise.Fencer under supervise.FenceNode's
//     guard, and register again by supervise.MayRegister; the membership
//     alone, with no partition in it.
//
// # What it does not model
//
// More than two sources, a destination that dies for good, initiators
// that fail in a seeded run, the fence's decision within a rejoin run
// (fencing.go models it apart) and a fenced process's answer
// (wire.Fenced), initiators that join in a seeded run but the one that
// registers while a source node is away (a script's late initiator
// does too: setup late=N, open-feed; its dials fail until then), the
// rejoin of a replica a settlement failed, the end of a hold (a rejoin
// from a replica that comes back, an admin's accept-loss), a node's view
// gone stale while it is cut off from the coordinator (a replica is
// failed or held by the coordinator's records as they stand),
// an initiator waiting for replicas' results, several tasks, lost responses alone (a
// write applied whose answer is lost; a node cut off loses both ways),
// clock rate differences between nodes and the coordinator (a tick is a
// tick everywhere), a byte-stream transport (stream package) with its
// own flow control and keepalive, corrupted bytes (the wire package's
// fuzzers cover decoding), memory limits, or time spent executing: a txn
// takes no ticks. The destination's buffer is never full. Scenario
// scripts have no supervisor unless they ask (setup ... supervisor); their
// start command has the source node take the task directly.
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
//	(c) the run ends live within Faults+1 attempts (or with its
//	    partition held and no replica live: invariant f); every abort is
//	    explained by a fault or by the supervisor (a digest mismatch, a
//	    protocol or decode error or a stall with no fault is a bug); after
//	    every source attempt ends, the source executor has no gate and its
//	    partition no observer, and it runs all its safe point allows; every
//	    aborted destination replica is empty and runs nothing;
//	(d) no running processor accepts a message of a superseded epoch: it
//	    must return recovery.ErrStaleEpoch (a paused holder's late
//	    messages included: Stats.PausedLate, PausedRejected);
//	(e) the claims: a write is a message other than Abort accepted
//	    (returned no error) by a running processor while its sender still
//	    ran. At each node the accepted writes never go back in epoch, so
//	    two holders that both believe they hold the claim never
//	    interleave their writes. A holder learns it lost its claim within
//	    one window of the loss, or of waking if it was frozen then, and
//	    after it stops its source processor sends nothing but its Abort.
//	    A destination goes live at most once. At the end no claim is left
//	    and the task is done by the live attempt (a run ends only once a
//	    claim its holder could not give back has run out its lease). With
//	    Knobs.LeaseGuard (half the seeds) no write is accepted, and no
//	    destination goes live, for a holder whose claim's lease ran out,
//	    and at no tick do two holders that both believe they hold the
//	    claim both write. Without it a holder woken from a pause acts
//	    until its guard's first look, and its writes may be accepted after
//	    its claim ran out (Stats.WritesAfterLoss): epoch order is what
//	    protects the replicas there. A claim the supervisor deleted under
//	    a live holder (a reset, a revoke) is learnt within a window; its
//	    writes meanwhile are counted too, not failed.
//	(f) a replica lost for txns it may lack is held exactly when no
//	    other replica of the partition is live in the view (another
//	    source node's core live with its registration standing, or the
//	    destination live with its completion recorded), and fails
//	    otherwise; once held it takes in and runs nothing, serves no
//	    source, and stands at the end as it stood at its hold; no held
//	    replica is made live (the run has no admin to accept a loss).
//
// A panic in the code under test is a failure of the seed too.
package sim
