// Package load generates load on a rejoin cluster through its Go client
// (recovery/client): a writer of upserts to random keys of a kv table
// at a fixed rate or as fast as it goes, for a time or a count of writes
// (Config.Writes: `rejoin load`), measuring per-call latency and
// throughput, optionally recording every acknowledged write so they can be
// read back (Verify); and a bulk loader (Load).
//
// Keys and values are pure functions (Key, Value) of a row number and a
// write's version, in bench's shape, so a run needs no list of keys.
//
// Outcomes of a write: acknowledged (Txns: the node answered success),
// failed (Errors: a definite failure, nothing written), or uncertain
// (Uncertain: client.ErrUncertain, the write may or may not have
// happened). Latency is recorded for acknowledged writes only, from the
// call to its answer.
package load
