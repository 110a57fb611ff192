// Package cow streams a partition's tables to a recovering replica while the
// partition keeps executing transactions (DESIGN.md steps 4 to 6).
//
// The recovery source activates a table stream at a txn boundary S: every
// txn < S has executed and S has not. A cursor then walks each table's slots
// and cuts them into blocks of stored tuples. From S on, a change log records
// what changed behind the cursor: the primary key of each deleted row and the
// slot index of each inserted or updated row (a set: a slot that changed ten
// times is shipped once, with its latest content). A change ahead of the
// cursor needs no entry; the cursor will read it. After the snapshot the log
// is drained in catch-up rounds, deletes first, then the current tuple of
// every dirty slot that is still live. When the log grows faster than it
// drains, the package signals the executor to throttle.
//
// Who calls it: the recovery source processor, on the partition's executor
// goroutine between two transactions, through the partition.Observer hook.
//
// Invariants:
//   - Every slot behind the cursor that changed since S is either in the dirty
//     set or was deleted and its key is logged.
//   - The change log's size is bounded in bytes; reaching the bound throttles
//     execution, it never drops an entry or fails the rejoin.
//   - Deactivation, on success and on every abort, frees the log and leaves
//     the partition as it was before activation.
//
// Status: specified here, built by the protocol issue.
package cow
