// Package nodestate is a node's small durable record (DESIGN.md step 10,
// DESIGN.md step 10): who the node is, when it last started, whether it shut down
// cleanly, the state of each partition replica it hosts, and the highest
// rejoin fencing epoch it has seen per partition. It lives in a pebble
// database in the node's data directory.
//
// Who calls it: the node process, once at start (Open) and at clean
// shutdown (Close), for all its replicas at once at start (SetReplicas, one
// synced batch), and whenever a replica changes state (SetReplica). The
// supervisor learns from the report of Open which replicas need a rejoin.
//
// At start, a record without the clean-shutdown marker is an unexpected
// shutdown and is reported as one. Every replica is then put back to
// needs-rejoin, in one synced batch, before anything else happens: a
// partition replica is in memory, so whatever it held died with the process,
// and a rejoin that was under way (an interim state) is never half resumed.
// The report names the replicas that were in an interim state.
//
// The record does not decide whether the node is new: a wiped or
// replaced directory reads as First, so the node asks etcd instead
// (supervise.Incarnate, DESIGN.md "Incarnations and fencing"); First
// only says the directory was empty.
//
// The highest epoch per partition (RaiseEpoch, HighestEpoch) is the
// destination's fence across attempts and restarts: the node raises it,
// synced, before an attempt of a higher epoch starts, and refuses any
// attempt at or below it but the running one. Open keeps it as it was;
// ResetEpochs forgets it, for a node's first start in a cluster, whose
// epochs (its etcd's revisions) the directory's cannot be compared with.
//
// Invariants: the clean marker exists only between a Close and the next
// Open; every write is synced before it returns, so a record read after a
// crash holds everything acknowledged before it; a data directory belongs
// to one node id for life; a partition's recorded epoch never goes down.
package nodestate
