// Package partition is the in-memory replica of one partition: its tables,
// each a set of rows in stable slots under a primary key index, and a
// content digest kept up to date on every write so that two replicas
// compare their whole content in O(1).
//
// # Who calls it
//
// A replica's executor goroutine owns its Partition and makes every call,
// reads included; nothing here is safe for concurrent use. Transactions
// write through Table.Insert, Update, Delete and their Tuple forms. The cow
// package installs an Observer while a table stream is active, walks each
// table with Table.AppendTuples (the snapshot cursor) and reads dirty
// slots with Table.Tuple. A rejoin destination starts from Partition.Clear,
// applies shipped rows with Table.UpsertTuples and Table.DeleteKey, and
// checks Partition.Digest against the source's at handoff.
//
// # Rows, slots and keys
//
// A row is stored as its canonical tuple (wire.TupleEncoder): the same
// values always give the same bytes, so bytes are what is hashed, compared
// and shipped. Its primary key is the canonical tuple of the key columns
// (wire.AppendKey), compared and hashed as bytes.
//
// A row lives in a Slot from insert to delete; updates, primary key
// changes included, keep it there. Freed slots are reused most recently
// freed first, which lets a rolled-back transaction put a deleted row back
// where it was (Table.InsertTupleAt). Every live slot is below
// Table.SlotsLen, so a walk of [0, SlotsLen()) sees every row.
//
// # Storage layout
//
// Nothing in a table costs a Go heap object per row, so millions of rows
// leave the garbage collector little to scan:
//
//   - The arena holds tuple bytes back to back in pointer-free chunks of
//     4 KiB growing to 1 MiB (ChunkBytesMax); a tuple above 256 KiB gets a
//     chunk of its own. An update that is no longer than the old tuple
//     overwrites it in place; a longer one is placed anew. Dead bytes are
//     counted per chunk; a chunk with none live is released at once, and
//     when the sealed chunks are more than a quarter dead, an incremental
//     compaction moves the live tuples of the chunks under three quarters
//     live into fresh ones, a few slots per write, and releases them.
//   - The slot table is pages of 8192 twelve-byte entries (chunk, offset,
//     length); a free entry links the free list instead.
//   - The primary key index is an open-addressing table of 8-byte buckets
//     (32-bit key hash, slot) with linear probing, kept under 3/4 full by
//     doubling, with backward-shift deletion. Keys are not stored: a hash
//     match is confirmed by reading the key out of the stored tuple, in
//     place when the key columns lead the tuple, else into a scratch buffer.
//     A large index misses the caches on nearly every lookup, so
//     Table.UpsertTuples, the rejoin's apply path, loads the home buckets
//     of a batch of rows first, letting their misses overlap, then writes.
//     Table.Reserve sizes the index for a count of rows in one rehash
//     (a rejoin destination, for the source's rows, before the snapshot),
//     instead of a rehash at every doubling; the count is capped at
//     ReserveRowsMax, so a wrong one costs at most a 32 MiB index.
//
// The slot table and the index keep their size when rows go; only
// Partition.Clear shrinks them.
//
// For rows of a 16-byte key and a 100-byte value (a 121-byte tuple) this
// costs about 147 to 151 bytes per row at 1 to 5 million rows, against 116
// raw bytes; BenchmarkPartitionInsert measures it.
//
// # Invariants
//
// Each data structure states its own beside its fields. Across them: a
// write that returns an error has changed nothing (it validates, then
// mutates); a slot is live exactly when it has an index bucket and a
// tuple in the arena; a table's digest equals the sum of RowHash over its
// live rows; the observer hears of every change, after it is applied, and
// of nothing else. Table.verify checks all of this from scratch for tests.
//
// # Digest
//
// A table's digest is the sum mod 2^64 of RowHash(table ID, tuple), a
// seeded 64-bit xxhash, over its rows; the partition's is the sum over its
// tables. Addition is commutative and invertible, so a write adjusts the
// digest in O(1) and any order of writes reaching the same rows reaches
// the same digest; slots and history do not matter.
//
// This is strong enough because the content is not adversarial: rows come
// from the system's own transactions, not from someone searching for
// collisions, and xxhash64 behaves as a random function on such input. Two
// replicas whose row sets differ then have equal digests only if the sum of
// the hashes of the rows in one and not the other cancels mod 2^64, which
// happens with probability about 2^-64 per comparison, far below the rate
// of undetected memory or disk faults. A sum rather than a XOR matters
// because XOR cancels pairs: a row applied twice, or present in two
// copies, would vanish from an XOR digest, whereas a sum counts it twice.
// It is not a defence against a deliberate attacker; a keyed or
// cryptographic hash would be needed for that.
//
// # Executor and procedures
//
// A transaction is an Invocation: a txn ID, a procedure name and its
// parameters as a tuple. Procedures are registered by name in a Registry
// (NewBuiltinRegistry has insert, upsert, update, delete, read, increment
// and transfer) and must be deterministic: their effect depends only on the
// partition's content and the parameters, so every replica executing the
// same txns in the same order reaches the same content and digest.
//
// Every write of a procedure goes through a Txn, which keeps an undo entry
// per change (the old tuple for updates and deletes). A procedure that
// returns an error, a bad parameter or a violated constraint, is rolled
// back newest change first: the same rows in the same slots, the same
// digest. The undo changes reach the observer like any other, so a change
// log sees the rows come back. The error is the txn's result; it is not a
// failure of the replica, since every replica reaches the same error.
//
// The Executor runs the transactions of one replica. Each initiator's
// stream arrives in increasing txn-ID order, interleaved with heartbeats;
// the executor queues txns in a min-heap and runs the smallest only once it
// is at or below the safe txn ID of a txnid.Tracker, when no initiator can
// still send anything smaller. Invariants: executed IDs strictly increase;
// nothing above the safe txn ID runs; an arrival that is a duplicate, out of
// order, from an unknown initiator, at or below the last executed ID, or
// over QueueTxnsMax is rejected with an error and changes nothing. The
// executor does no I/O and reads no clock: a driver feeds it and calls
// Step, so a seeded simulator replays it exactly.
//
// Two hooks serve the rejoin. An Observer hears every change at the moment
// it is applied (cow's change log). A Gate is asked before every txn
// whether it may run, which lets the recovery source activate a table
// stream exactly at a txn boundary, pace execution while its change log
// drains, and hold the partition still for the handoff. Executor.ResetTo
// lets a destination start executing at the handoff txn E, dropping the
// buffered txns below it.
//
// Expensive self-checks (full structure verification and digest recompute
// after every txn) run under the invariants build tag:
// go test -tags invariants ./partition/.
package partition
