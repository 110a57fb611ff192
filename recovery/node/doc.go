// Package node is the rejoin node process (`rejoin node`): it hosts the
// partition replicas the cluster's placement gives it, runs an initiator
// for client calls, serves and receives rejoins over TCP, and takes part
// in supervision. Everything durable or shared lives in etcd (placement,
// node records, assignments, claims, task records: see recovery/supervise
// and recovery/claim) and in the node's pebble record (recovery/nodestate).
//
// # Identity and configuration
//
// `--id N` names the node "n<N>" and its initiator N. The cluster's shape
// (partitions, replicas, tables) is one JSON value under layout.Key,
// written once by layout.Init together with the placement
// (supervise.Place); every initial replica starts live, since an empty
// cluster's copies are trivially equal. Whether a start is the node's
// first is etcd's to say, not the data directory's: each start raises the
// node's incarnation (supervise.Incarnate), and only incarnation 1 brings
// replicas up live, where the placement says live (DESIGN.md
// "Incarnations and fencing"). A first incarnation over a directory that
// held a record forgets the directory's epochs (another cluster's).
//
// # Connections
//
// One TCP port carries wire frames (stream.Conn), in mutual TLS 1.3 from
// the cluster CA unless the node runs with Config.Insecure (package
// certs; docs/DESIGN.md "Who may talk to a node"). The TLS handshake runs
// first, under the hello deadline; a dialler without a certificate of the
// CA, or with an expired one, gets the TLS alert and the node logs why.
// A dialler checks that the server's certificate names the node it meant
// to reach. The dialer's first
// frame is a wire.Hello naming the connection's kind and the dialer's
// node; the node answers with its own Hello, naming itself, or a
// wire.Reply with the reason it refuses. A node that dials a peer (feed,
// repair, rejoin) refuses an answer that names another node than the one
// it dialled: the address it read from etcd may belong to another
// process by now.
//
//   - client: wire.Call in, wire.Reply out, pipelined, matched by Req.
//     Call.Each asks for every replica's result (verify uses it with the
//     read-only `digest` procedure: all replicas answer at one txn ID).
//   - feed: an initiator's txns (wire.Txn) and heartbeats (wire.Beat) for
//     every replica on the node, and its asks (wire.BeatAsk) that the
//     node's own initiator beat past the txns it sent; the node answers a
//     wire.Done per executed txn. One feed per initiator and node, in txn-ID order. The
//     Hello's Epoch is the sending process's incarnation (its start
//     time), so a receiver tells a restarted node's feed from a redial.
//   - repair: a peer replica node asks for a dead initiator's txns past
//     its prefix (wire.Repair); the answer is Txns and a wire.RepairEnd.
//   - rejoin: one attempt (partition, epoch in the Hello), dialled by the
//     source; then the recovery messages both ways. The destination first
//     checks in etcd that the task's claim stands at that epoch and is
//     held by the Hello's node (the source claims with
//     supervise.ExecutorID, which names it; supervise.ClaimHolder).
//
// Every hello is checked against the dialler's certificate before
// anything else (auth.go): a client certificate may open only client
// connections; node n<N>'s may open feeds only as initiator N and node
// n<N>, rejoin and repair streams only as n<N>, and no client connection.
// So a rejoin is served only if the node whose certificate made the
// connection holds the task's claim at the hello's epoch. A refusal is a
// Reply naming the reason, logged on the node (rate-limited per reason)
// and counted in rejoin_conns_unauthorized_total.
//
// Until its hello is checked a connection is in a pool of its own
// (HandshakesMax, HandshakesPerSourceMax; a full one closes its oldest
// silent connection for a new one) and its hello frame is bounded by
// wire.HelloFrameBytesMax. Past the hello it takes a slot: the node
// serves at most ConnsMax connections at once, NodeConnsReserved of them
// for node certificates only; one more is answered with a Reply that
// says the connection limit is reached, and closed. A connection has
// HelloTimeout for its TLS handshake, its hello and the answer (conns.go:
// the deadline is set at accept and lifted by the node's first write, its
// answer); a client connection idle for ClientIdleTimeout is closed. A
// failed Accept is retried after a backoff. A client connection's calls in flight, with their
// replies until written, are bounded by ClientBytesMax: past it the node
// stops reading the connection until replies drain, so TCP slows the
// client and every call is still answered (docs/DESIGN.md "Bounds").
//
// # The replica loop
//
// Each replica is one goroutine driving its core, a recovery.Replica
// (replica.go): the core owns the executor, the partition, the lifecycle
// (live, rejoining, needs-rejoin, with its table of legal moves), the
// initiators heard, the rejoin attempts and the fence, and makes every
// decision about them (docs/DESIGN.md "The replica core"). Every input
// (feed, rejoin message, fault, membership change) reaches the goroutine
// as a closure through a bounded inbox and goes into the core, except
// the feeds' heartbeats: a feed's reader raises the feed's heartbeat slot
// and wakes only the replicas waiting for one, and a replica reads the
// slots while it has txns waiting for the safe point or an attempt under
// way, applying what it read only after the events queued before the read
// (beats.go; docs/DESIGN.md "Heartbeats by slot"); the
// goroutine then drains the core's outbox (drain): each txn's Done to its
// initiator, messages onto the attempts' links, endings and state changes
// into the node's record, etcd, the metrics and the log. It runs ready
// txns in bursts (one a call while it serves a source, so the handoff's
// pause is timed finely), and ticks the core every 10 ms while an attempt
// runs on the replica (the attempts' timeouts count ticks); an idle
// replica gets no tick and costs nothing between its events, a heartbeat
// included (docs/DESIGN.md "Ticks only for attempts under way"). What stays in the driver is I/O and wall time:
// the links, the claim and its lease guard, the task record's touches,
// the fault points, the durable epoch (raised between the core's fence
// check and the attempt's start), the handoff pause in wall time.
//
// The driver is one file per owner: conns.go accepts connections and
// serves clients; feed.go the feeds in and out; source.go a rejoin's
// source side (the claim holder: assignments, claims, the attempt, its end in
// etcd); destination.go its destination side (the hello checked against
// the claim, the attempt, the task opened and completed); repair.go the
// tail repair; registration.go the registration's terms and settlements;
// members.go and reconcile.go the view and the placement; http.go the
// admin HTTP; node.go the start, the replicas' records and the stop.
//
// # The initiator
//
// A node's initiator is recovery.Initiator, the pure core, driven by
// feed.go: the core decides (txn IDs, whom a call waits for, when a
// heartbeat is due, which node to dial and what its hello's Missed says,
// the floor rule), and the driver dials, reads and writes the feeds,
// ticks the core every BeatEvery and gives it the membership view every
// 100 ms. The core assigns txn IDs (txnid.Generator) to client calls and
// sends each to every replica of the call's partition on a live node,
// under one lock so that every feed carries IDs in increasing order. It
// sequences a call only once it has a feed open to every node of its view
// that holds a replica of the partition, live or not (recovery.Unfed; a
// feed that broke to a process that lives counts, since its replicas then
// fail); it waits up to 3 s for them (feedWait), then fails the call,
// which was sent nowhere (docs/DESIGN.md "Feeds that open late"). Only
// the nodes holding a replica of a partition sequence it: a call of
// another partition goes over this node's feed to one of its holders,
// which sequences it and sends the reply back among the feed's answers
// (forward, serveForward). And before a partition's first txn on a feed
// the initiator joins it there (wire.Join, answered with the partition's
// floor; joinFeed), so a replica tracks only its partition's holders and
// one silent node stalls only the partitions it holds (docs/DESIGN.md
// "Sequencers per partition"). It answers the client once every replica that was live when the call was
// sequenced has executed it, so an acknowledged write is on every live
// copy and survives the loss of any one node. A rejoining replica gets
// the feed too (its destination buffers it) but is not waited for. When
// a feed breaks, the initiator stops waiting for that node. An idle feed
// carries a heartbeat every BeatEvery. After each call it sequences, the
// initiator asks every other node's initiator, on its feed there, for a
// heartbeat above the call's txn ID (wire.BeatAsk, one per burst the feed
// writer flushes), and a node that reads one has its own initiator beat
// past it at once (recovery.Initiator.BeatPast): the replicas that got
// the txn wait for the other initiators a round trip, not up to a
// BeatEvery (docs/DESIGN.md "Heartbeats on demand"). An initiator that has
// sequenced nothing for 25 ms sends its heartbeats Config.BeatLead (100
// ms) ahead of its clock, so the txns of a node that writes find it passed
// already and wait for nothing of it, even while it is too busy (rejoining)
// to answer an ask at once (docs/DESIGN.md "Heartbeats that lead").
//
// The feed to the initiator's own node is an in-process pipe served as an
// accepted connection is, without TCP and TLS (initiator.selfFeed;
// docs/DESIGN.md "A node's feed to itself").
//
// A source replica paces its snapshot by its partition's write latency
// (pace.go): while more than one txn in 50 waits over Config.PaceTarget
// (2 ms) from its feed to its Done, the attempt's link is slowed, and it
// speeds up again as the waits stop (docs/DESIGN.md "The rejoin takes
// what the writes leave"). A destination node applies at most
// Config.ApplyMax rejoin blocks at once (one core less than it has), so
// its live replicas, feeds and network poller always find a core.
//
// When a feed from an initiator ends (or brings nothing for a second),
// the replicas go on waiting for the initiator while the membership has
// its process alive: the process keeps what it meant for this node and
// resumes the feed where it stopped (docs/DESIGN.md "Feeds that
// resume"). Once the process is gone, nothing more of it can arrive.
// A node that dies while sending a txn may have reached some replicas of
// the partition and not others; since each feed is one ordered stream,
// each survivor holds a prefix of the initiator's sequence, and nothing
// past it has run while the initiator is in its safe-point tracker. So
// before a replica stops waiting for the initiator, it asks every live
// peer replica of its partition for that initiator's txns past its own
// prefix (repair.go, by recovery.TailRepair's rule; each replica keeps the
// latest 16k per initiator) and takes them in: every survivor runs the
// longest prefix any of them got.
// A peer that cannot answer (its own feed from that incarnation of the
// initiator still open, or the range no longer kept) fails the replica:
// it rejoins rather than risk diverging. If the process was only taken
// for dead and comes back, the survivors' agreement stands: its redial
// is answered with wire.Fenced, and its own replicas of the partitions
// live here fail and rejoin.
//
// The feeds of one initiator are taken in one after the other: a feed
// from a restarted node (a newer incarnation) is read only once the old
// feed's tail is settled, so the repair never removes the initiator from
// a replica's safe-point tracker after the new feed added it, and a peer
// answers a repair of the old incarnation with its txns only, whatever
// the new feed brought meanwhile. A txn or heartbeat that a replica, or
// its rejoin attempt, cannot take in fails it (or aborts the attempt): a
// replica never stays live with a hole in its feed.
//
// # Rejoins
//
// A node that ran before in the cluster (incarnation above 1, whatever its
// data directory holds) finds its replicas' content gone: before it
// registers, every one is set to needs-rejoin in its record and in etcd,
// so no initiator waits for it. It then opens
// their rejoin tasks, at most IncomingMax at once (the per-node limit);
// the supervisor (any node may win the election) assigns each a live
// source.
//
// The source's assignment loop watches its assignments, claims the task
// (claim.Acquire: the claim's epoch is the attempt's fencing epoch),
// marks it running, dials the destination and starts a recovery.Source
// on the replica. Before any message of the attempt is sent the replica
// checks the claim's lease guard (Claim.Held); a claim that may have
// expired aborts the attempt. While the attempt makes progress (the
// processor's Progress moves: blocks acknowledged, the handoff
// acknowledged) the replica refreshes the task record (claim.Touch), at
// most once a claim window, so the supervisor's health task, which resets
// a running task left untouched for the stall window plus two claim
// windows, never resets a rejoin that moves on, however long it takes. A
// newer attempt at the same task supersedes the source attempt running on
// the replica; another task's waits for it to end. The attempt is done
// only when the destination's HandoffAck says it is live at E with the
// source's digest: then supervise.Complete; on any failure, after the
// last block too (the handoff lost, a digest mismatch, an abort), the
// task is requeued, and the claim released. The destination completes the
// task as well when it goes live, so a lost ack costs nothing: whichever
// of Requeue and Complete lands first, the task ends done.
//
// The destination starts a fresh executor and recovery.Destination per
// attempt, over the initiators whose feeds are open; a feed that opens
// during the attempt is added to it (Destination.AddInitiator), and the
// attempt goes live only holding every txn >= E of each initiator the
// source still runs (docs/DESIGN.md "Feeds that open late"). A higher
// epoch supersedes the current attempt, a lower one is refused
// (recovery.Replica.CheckDestination, the one fence check). Each replica
// keeps the highest epoch it has started an attempt at (its fence), in
// the node's record (nodestate.RaiseEpoch, synced before the attempt
// starts) and read back at start into its core: an epoch at or below
// it is refused unless it is the running attempt's, resumed from the same
// node, so an attempt that ended, before or after a restart, never
// starts again. Until an attempt starts, a needs-rejoin replica drops the
// feed: the attempt buffers from its own start, which is all the
// handshake needs. A live destination goes on routing the feed through
// its processor, which takes txns below E that arrive late as heartbeats.
//
// The attempt's buffer is bounded in bytes (RejoinBufferBytesMax). The
// feed is never held up for it: it carries every replica's txns, and a
// live replica must not wait on a rejoining one. Instead, past half the
// bound the destination sends wire.Hold and its source runs no txn of the
// partition until the handoff; the initiators wait for the source, the
// partition's calls stay in flight, and each client connection's byte
// bound stops its client. Only a buffer full despite the hold aborts the
// attempt (docs/DESIGN.md "Bounds").
//
// A rejoin link encodes each message into a frame on the replica
// goroutine (a block's tuples are a copy from then on) and its writer
// goroutine writes the frames; the writer hands each written frame's
// buffer back to be encoded into again (at most 16 of them, of up to
// 1 MiB), so a snapshot's blocks do not each cost a fresh 256 KiB. The
// destination's read loop copies each block out of the connection's
// buffer into one of the same kind of free list, which the replica
// goroutine refills once the core has applied (or refused) the block.
//
// A broken rejoin link is redialled by the source for resumeGrace; a new
// connection with the same epoch resumes the attempt on both sides: the
// frames queued for the old connection are dropped and Resume sends again
// what the peer may have lost, at most one window of blocks. A peer whose
// node dies (no record in etcd) ends the attempt on the other side
// (DESIGN.md step 8). The destination also ends its attempt, with
// wire.AbortNodeFailed (the self-termination of DESIGN.md step 8), when any other node
// whose replica of the partition was live at the attempt's start fails:
// its record gone or its replica no longer live. The source sees the
// abort and requeues; its next attempt watches the nodes live at its own
// start, so a node already down never ends attempts over and over.
//
// # The view of the cluster
//
// Each node keeps a view of the live nodes and of the placement with each
// replica's state (members.go): listed once at start, then followed by an
// etcd watch from the listed revision (supervise.Membership), listed
// again only when the watch ends (a compaction, an error, etcd's member
// losing its leader) and for a lapse's settlement. The view is rebuilt at
// most every 100 ms, when the records changed; a node's activity update
// keeps the placement as built. Every 100 ms the rejoin attempts' peers
// are checked against it: every replica's when the live nodes or the
// placement changed, else those with an attempt under way. So an idle
// node reads nothing from etcd for its view, whatever the number of
// replica records (12,288 at 4096 partitions x 3 replicas, which a list
// every 100 ms could not read in time).
//
// # Placement changes while running
//
// The replicas follow the placement (reconcile.go, docs/DESIGN.md
// "Membership moves"): when a view's live nodes or placement changed,
// the node creates the replicas the view newly places on it and drops
// those it no longer does. The replicas are a map behind an atomic
// pointer, copied and replaced whole on a change, so the feed's lookup
// per txn stays one load and no lock. A new replica starts needs-rejoin,
// as a restarted node's would: it tracks the initiator of every feed open
// that joined its partition (joinFeed adds the initiator to the replica
// in the map; the new one is published before the open feeds are read,
// so no join is missed), and
// its feed is dropped until a destination attempt buffers it. Its rejoin
// task opens only once every running node's record says its view holds
// the new replica (NodeRecord.ViewRev at or past the revision the replica
// appeared at): from then on no initiator sends a txn of the partition to
// the source alone, so the attempt's proposal lies above anything it
// lacks. A node back from a lapsed registration, which no record counted
// meanwhile, sequences no call until its view is as new as its
// registration (viewBehindTerm). The rejoin is then a normal one, with the same claims, fencing
// and supervision; the old holder, still live, may be its source. A
// dropped replica aborts its attempts (core Stop), its loop ends, its
// content goes with it, and asks made of it return false. A node
// publishes a replica's state change only to a record that exists
// (supervise.UpdateReplica).
//
// # Stopping
//
// A stop is bounded by StopMax from the moment it begins: past it the
// node closes its etcd client, which fails every etcd call still waiting
// (an attempt reporting its end, a claim released, the deregistration),
// and logs the step it gave up; what etcd holds of the node then ends
// with its leases. With etcd gone, a stop used to wait out every call's
// own timeout in turn, and a supervisor stopped mid-campaign waited for
// etcd for ever (supervise.Supervisor.Run now bounds it).
//
// # Without the coordinator
//
// A lost registration (supervise.Term ended: etcd not reached for a
// window, lease gone, record removed) does not stop the node
// (registration.go, docs/DESIGN.md "Without the coordinator"). Its
// replicas, its feeds and its execution go on, the view frozen at its
// last read; its claims are released (its source attempts abort), and it
// takes no assignment, opens no task, runs no supervisor and sequences no
// new client call until it is registered again. Initiators keep their
// feed to a node etcd takes for dead (they only stop waiting for it), and
// tie a feed to the node's process (its record's Started), so a node that
// re-registers receives every txn sequenced meanwhile. After a lapsed
// registration, its replicas stay live only if every node registered now
// or meanwhile has the feed into it that was open when the term ended, or
// its process's hellos since the outage began name none of their
// partitions; otherwise they are failed and rejoin. The decision is
// recovery.Settle; this package reads what it needs and waits, boundedly,
// for a feed it names. An initiator stops waiting for a
// replica that its view no longer has live. Every wait on etcd before the
// node is ready is bounded by Config.EtcdTimeout (`--etcd-timeout`).
//
// # Admin HTTP
//
// GET /status (Status as JSON, with tls or insecure), GET /timeline
// (Timelines: every rejoin attempt the node took part in, as source or
// destination, sampled every 100 ms; ?partition=P, ?last=N), GET /metrics
// (Prometheus); with Config.Pprof GET /debug/pprof/ (Go's profiles), and
// with Config.FaultPoints the fault points the demo and tests use (each
// is 404 otherwise), both only to a client certificate of the admin
// identity, client:root (certs.AdminName), over TLS, on loopback too (the
// loopback port takes TLS and plain HTTP both: admin.go). Off loopback
// the admin HTTP is TLS only with the node's certificate and asks for a
// certificate of the cluster CA (a scraper's client certificate), and the
// registered address is https://host:port. It holds 64 connections at
// most, each with read-header, read and idle timeouts.
// The fault points are applied on the replica's goroutine:
// POST /fault/hold?partition=P&rows=N (the source holds the destination's
// acks once its snapshot has sent N rows), /fault/release, /fault/cut-link
// (close the rejoin's TCP connection), /fault/pause-holder?for=D (the
// source attempt's I/O stands still and its claim's keepalive stops, as
// in a process stalled past its TTL).
//
// The timelines (timeline.go) are recorded by one goroutine of the node,
// which every TimelineEvery reads each replica's published status (the
// atomic pointer the replica refreshes every tick) and appends a sample
// to the timeline of each attempt under way: cumulative rows, bytes,
// change-log peak, throttle and hold, the replica's txns executed, the
// phase. It never touches a replica's goroutine. A timeline is a ring of
// the latest TimelineSamplesMax samples; the node keeps at most
// TimelineRejoinsMax timelines, a new attempt taking an ended one's
// place (none ended: the newcomer waits, counted as untracked). An
// attempt's final phase, or its leaving the status unseen, ends its
// timeline.
//
// Config.PlantDropKey is a planted fault for `rejoin chaos`'s own test
// only (plant.go): the initiator writes its first upsert of that key
// under another key and acknowledges it, a lost write the chaos checker
// must report. The command sets it only from the environment variable
// that `rejoin chaos --plant` gives its nodes.
//
// # Invariants
//
//   - Only a replica's goroutine touches its core, and through it its
//     executor and processors; every decision about the replica is the
//     core's.
//   - Every queue is bounded: replica inboxes, feed queues (a full one
//     closes the feed rather than wait), a rejoin link's frames and
//     the frame and block buffers it keeps for reuse, a
//     client connection's calls and replies (in bytes: a full one stops
//     reading), a rejoin's buffer (in bytes: a full one holds the
//     source), the connections (ConnsMax) and each one's hello
//     (HelloTimeout).
//   - Run returns only after every goroutine it started has ended.
package node
