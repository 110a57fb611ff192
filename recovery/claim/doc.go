// Package claim makes sure one executor at a time works each rejoin, keeps
// a record of every rejoin task, and runs the etcd they live in when no
// external one is given (DESIGN.md steps 1, 9 and 10, and
// "Without the coordinator").
//
// A rejoin task is partition P rebuilt onto node D (Task). Its executor
// calls Acquire before it sends anything: the claim it gets carries the
// fencing epoch that goes into wire.MsgHeader.Epoch of every message of the
// attempt. While the attempt runs, the executor selects on Claim.Lost and
// stops at once, writing nothing more, when it closes; it refreshes its
// task record with Touch whenever the attempt has made progress (at most
// once a window), so that the record's age is the time since its last
// progress, and ends with MarkDone, Requeue or MarkFailed and then
// Release. The coordinator's leader (supervision) opens tasks with
// CreateTask and runs ResetStale as its periodic health task. cmd/rejoin
// starts StartEmbedded for the single-machine setup, with
// EmbeddedOptions.TLS (https, client certificates required) unless
// insecure; tests use it too.
//
// # Why the epoch, not the lease, keeps two executors from both writing
//
// The lease bounds how long a dead executor blocks its task: etcd deletes
// the claim key a TTL after the last refresh, and another executor may
// claim. It cannot stop a live one. An executor learns of the expiry late
// (up to a window after it, by its own checks) or, if its process is
// paused (GC, SIGSTOP, a VM stall) or cut off from etcd, not before it acts
// again: the limit of any claim held by a lease (DESIGN.md, "Without the coordinator"). So each claim also has an
// epoch, the etcd revision that created its key, which grows from one
// claim of a task to the next. The epoch travels on every rejoin message,
// and both the source and the destination drop a message with a lower
// epoch than the highest they have seen, and give their attempt up when
// they see a higher one (recovery.checkHeader). Once the new attempt's
// first message has reached the destination, whatever the old executor
// still sends is dropped there, whatever the old executor believes. Task
// records get the same protection from the claim key: a change in an
// attempt's name compares the claim key's CreateRevision with its epoch in
// the same transaction.
//
// # Key layout in etcd
//
//	/rejoin/claims/<P, 10 digits>/<D>  value: executor id "host:pid:nonce"
//	                                   lease: the claim's lease
//	                                   CreateRevision: the claim's epoch
//	/rejoin/tasks/<P, 10 digits>/<D>   value: Record as JSON (status,
//	                                   attempts, executor, epoch, updated_at,
//	                                   note)
//	                                   CreateRevision: the generation (Opened)
//
// Partitions are zero-padded so that listings come in partition order. To
// share one etcd between clusters, wrap the client's KV and Lease with
// go.etcd.io/etcd/client/v3/namespace.
//
// # Invariants
//
//   - A task has at most one claim key, created only if absent in one
//     linearizable transaction, so at most one executor holds it.
//   - The epochs of successive claims of a task strictly grow: etcd's
//     revision is cluster-wide, replicated, persisted and raised by one at
//     every write; a new claim key can only be created after the old one's
//     deletion, itself a write. Restarts and compaction keep the counter; a
//     wiped data dir does not, so etcd's data must outlive every replica's
//     memory of an epoch.
//   - Lost closes at most one window after the claim stopped being ours,
//     including when etcd stopped answering (no check succeeded for a
//     window). The window is at most half the TTL, so an executor cut off
//     from etcd gives up before its lease can have expired and another
//     claimed, as long as clocks run at similar rates.
//   - A claim's goroutines (its check loop, its lease keepalive) end when
//     Lost closes; Release returns after they have.
//   - A record goes to running, or is touched, requeued or failed, only in
//     the name of the attempt that holds the task's claim. A completion is
//     accepted from any attempt of the record's generation (epoch above
//     Opened), and a done record stays done: later completions are
//     reported as ErrDuplicate and change nothing.
//   - Record logic (record.go) is pure: it takes the time as an argument
//     and reads no clock, so scripts replay it exactly; wall time is read
//     only by the claim's driver (Acquire and its check loop).
//
// # Timing
//
// With a TTL of 2 s and a window of 500 ms (the takeover tests, measured
// under -race on a loaded two-core machine): an executor whose keepalive
// stops sees its key deleted 2.1 to 2.5 s later (TTL, plus etcd's 500 ms
// expiry sweep), is told 30 to 90 ms after that, and a new executor polling
// every 20 ms claims within 20 ms of the deletion. An executor cut off from
// etcd is told after about 380 ms, before the new claim at 1.6 to 2 s (the
// TTL counted from its last refresh, which precedes the cut).
package claim
