// Package supervise is the parent of every rejoin (docs/DESIGN.md "The
// rejoin protocol", step 9) and the master-only health task of startup
// recovery (step 10): it keeps a registry of live nodes, picks for each rejoin task a
// source among the live replicas of its partition, reassigns the task as a
// new attempt when that source dies, declines or loses its claim, and
// runs one supervisor at a time, elected through etcd.
//
// # Who calls it
//
//   - Every node process calls Register at start. Its registration goes
//     through terms (Term): the node derives its rejoin work from the
//     current term's Context and gives the claims it acquires to
//     Node.Hold. A term cut off from etcd for a window, whose lease ended,
//     or whose record the health task removed, ends and its claims are
//     released (DESIGN.md, "Without the coordinator"): the work stops before the lease can expire and
//     be reassigned. The Node lives on and registers again when etcd
//     answers (NextTerm): on the same lease if it outlived the outage,
//     else on a new record, Term.Lapses counting that others may have
//     taken it for dead meanwhile (docs/DESIGN.md "Without the
//     coordinator"). Only Close, or a newer process registering under the
//     same id (ErrSuperseded), ends the Node. RegisteredBetween reads from
//     etcd's history which nodes registered while one was away.
//   - Every node that may supervise runs a Supervisor (Run); the one that
//     wins the election (concurrency.Election over a Session whose lease
//     is the supervisor's liveness) runs passes and the health task; the
//     others wait in Campaign and take over within the session TTL when it
//     dies.
//   - A node calls Incarnate at every start, before it reads the
//     placement: only its first incarnation may start replicas live. It
//     records the state of its replicas with SetReplicas at start (after
//     nodestate.Open; in transactions of at most ReplicasTxnOpsMax puts)
//     and SetReplica when a rejoin ends.
//   - A destination calls ClaimHolder on a rejoin hello: the claim must
//     stand at the hello's epoch and name the hello's node.
//   - The executor on an assigned source watches its assignments, claims
//     the task (claim.Acquire: the claim's epoch is the attempt's fencing
//     epoch), or refuses it with Decline when over its limit, and reports
//     the result with Complete, which takes a completion from any attempt
//     and ignores (logging) later ones.
//
// # Key layout in etcd
//
//	/rejoin/nodes/<node>              NodeRecord JSON (address, started,
//	                                  last_active, status, outgoing_max,
//	                                  view_rev);
//	                                  on the node's lease: no key = dead;
//	                                  started names the process, kept
//	                                  across its re-registrations; each
//	                                  registration is a new key (its own
//	                                  CreateRevision)
//	/rejoin/replicas/<P,10 digits>/<node>  {"state":"live"|"needs-rejoin"};
//	                                  no lease: placement outlives processes
//	/rejoin/assign/<P,10 digits>/<D>  Assignment JSON (source, seq, opened,
//	                                  assigned_at, superseded, declined,
//	                                  reason), written by the supervisor
//	/rejoin/incarnations/<node>       Incarnation JSON (count, started):
//	                                  raised by one at each start of the
//	                                  node (Incarnate), no lease; count 1
//	                                  is the only start whose replicas may
//	                                  be live (DESIGN.md "Incarnations and
//	                                  fencing")
//	/rejoin/moves/<P,10 digits>       Move JSON (from, to, started,
//	                                  live_before): a membership move under
//	                                  way (StartMove to FinishMove; outside
//	                                  the membership watch's range)
//	/rejoin/supervisor/<lease>        the election (concurrency.Election)
//	/rejoin/cluster, /rejoin/init     recovery/layout's config (written last
//	                                  by layout.Init, after the replicas)
//	                                  and the token of an init under way
//	/rejoin/claims/..., /rejoin/tasks/...  recovery/claim's claims and task
//	                                  records (see its doc); a node's
//	                                  source claims with ExecutorID,
//	                                  "<node>/host:pid:nonce", so that
//	                                  ClaimHolder names the node
//
// # When a task is reassigned
//
// An open task keeps its assignment while its source lives (its record
// under its lease), still hosts a live replica, has not declined it and,
// with no claim on the task yet, has claimed it within
// Limits.ClaimWithin and is not marked not-responding. A claim on the task
// keeps it wherever it was taken (DESIGN.md step 9: whoever works a task, the
// outcome is the same, and the claim's epoch fences every other attempt),
// unless its source is dead, declined or no longer live. A running task
// whose claim is gone is reassigned at once. Every reassignment is a new
// attempt: Seq+1, and a new claim, whose epoch is higher than every
// earlier one. The scripts in testdata/decide_*.txt walk through it.
//
// # Shape
//
// The logic is pure: Decide takes a Snapshot (nodes, placement, task
// records, claim keys, assignments) and the time and returns the actions
// of one pass, at most Limits.PassActionsMax; CheckHealth does the same
// for the node part of the health task. Neither reads a clock. The driver
// (Supervisor) reads the snapshot, calls them, and writes each action as
// one transaction. A pass's snapshot holds the placement of the
// partitions with a task not final only (at most 64 of them; the whole
// placement past that): Decide picks sources for nothing else, and a
// whole placement of 12,288 records every 200 ms was most of etcd's
// work at 4096 partitions x 3 replicas.
//
// Nodes follow the membership (node records and placement) with
// ListMembership once and then WatchMembership's events applied by
// Membership.Apply, so that an idle cluster costs no reads however many
// replica records it holds (docs/DESIGN.md "Following the membership").
// Supervisor.Run bounds the resignation of a campaign its context ends
// (etcd's Campaign resigns under its client's context, which has no
// deadline).
//
// # Invariants
//
//   - Only the elected supervisor writes assignments and health marks:
//     every such write is a transaction whose guard compares the election
//     key's CreateRevision with the one the supervisor won with, so a
//     deposed supervisor that has not noticed yet writes nothing.
//   - Every assignment write is a compare-and-swap on the assignment's
//     ModRevision from the snapshot, so a pass never overwrites a change
//     (a decline, another pass) it did not see; it sees it next pass.
//   - A reassignment of a task whose claim stands deletes that claim (the
//     epoch it read) in the same transaction: the old executor sees its
//     claim gone within its window and stops, and whatever it still sends
//     carries a lower epoch than the new attempt's claim, which the source
//     and destination drop (recovery/claim's fencing).
//   - A source is never the destination, always hosts a live replica of
//     the partition, has a live record not marked not-responding, has not
//     declined the task in this generation (until every qualifying source
//     has: then they are asked again ClaimWithin after the last
//     assignment), and is below its OutgoingMax counting the assignments
//     of open tasks.
//   - Every loop is bounded: a pass by PassActionsMax writes and
//     PassTimeout; a listing by claim.TasksMax keys; a node's checks and
//     each try to register again by its window; the leader loop ends with
//     its context or its session, the node loop with Close or
//     ErrSuperseded.
//
// # Membership moves
//
// `rejoin drain` and `rejoin rebalance` move replicas between running
// nodes (move.go, docs/DESIGN.md "Membership moves"). PlanDrain and
// PlanRebalance are pure: from the registered nodes, the placement and
// the moves under way (MoveState) they say which moves to start within
// MoveLimits (moves at once, moves onto one node); CheckFinish says when a
// move may end: its new replica live on a running node, and the partition
// keeping without the old one the live replicas it had when the move
// started (Move.LiveBefore). The writes (move_etcd.go) are one etcd
// transaction each: StartMove records the move and adds the new replica
// needs-rejoin, conditional on the partition's placement and the new
// node's registration as read; FinishMove removes the old replica, the
// move and any task onto the old node, conditional on every record of the
// partition and every live one's registration as read. MovePass is one
// read-finish-plan-start round; the command loops it, and a command run
// again goes on where one stopped. A node publishes its state with
// UpdateReplica, which changes only a record that exists, so the node
// that drops a moved replica cannot put its record back.
//
// # Timing
//
// Measured under -race on the two-core test machine, session and node
// lease TTL 2 s: a dead supervisor (client closed, no resignation) is
// replaced after 1.7 to 2.5 s (the lease's TTL counted from its last
// keepalive, which precedes the death by up to TTL/3, plus etcd's expiry
// sweep); a dead source's task is reassigned and done by another source
// within about 2.5 s; a node whose etcd stops ends its term after one
// window (500 ms in the tests), well before its 2 s lease expires, and
// registers again within a try interval (window/4) of etcd answering.
package supervise
