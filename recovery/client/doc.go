// Package client is the Go client of a rejoin cluster.
//
// Open reads the cluster's shape from etcd (/rejoin/cluster: the partition
// count and the tables) and the live node records (supervise.Nodes), and
// talks to the nodes over stream.Conn: a wire.Hello{Kind: HelloClient},
// then wire.Call frames answered by wire.Reply frames, pipelined and
// matched by Req (the connection kinds are in recovery/node's doc).
//
// The client keeps at most one connection per node. A reader goroutine per
// connection matches replies to calls; up to Options.PipelineMax calls are
// in flight on a connection at once. Calls made while a write is under way
// share the next write: a caller writes its own frame and those queued
// meanwhile, and past two writes hands the rest to the connection's writer
// goroutine, so many callers cost a syscall and a TLS record per write,
// not per call, and one caller no goroutine hop. A call goes to the allowed live nodes
// round-robin; a node that cannot be reached is skipped, redialled later
// with backoff, and the node records are read again from etcd, so a node
// that restarted on a new address is found.
//
// Outcomes:
//   - nil: the node executed the call; Result.ID is its txn ID.
//   - ErrProcedure: the node answered with an error (Reply.Err); the txn
//     did not commit. ErrNotFound as well when that error is a missing
//     row (a read or delete of a key that is not there): the reply says
//     so only in its text, partition.ErrNoRow's.
//   - ErrUncertain: the call was sent but no answer came (the connection
//     broke, the call timed out, or the client was closed), or the node
//     answered that the txn went out but every replica it waited for was
//     lost before answering (Reply.Uncertain): the write may or may not
//     have happened. The client never resends such a call.
//   - ErrRefused: a node refused the call with nothing sequenced, with a
//     code on the wire (wire.Reply.Refused), never told by text:
//     ErrNotBootstrapped (a node of the placement never started; no node
//     takes a write yet), or a refusal of the node's own, ErrNotRegistered,
//     ErrNotReady or ErrStopping, after which the call goes to the next
//     node; it comes back, with ErrNoNode, once every node refused it.
//   - ErrInvalid: the call cannot be sent as it is (params over
//     wire.ProcTupleBytesMax, 4 MiB): it fails before anything is sent.
//   - ErrNoNode: no allowed node could be reached; nothing was sent.
//
// Close ends every goroutine of the client.
package client
