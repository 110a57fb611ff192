// Package stream moves wire frames between two processes: TCP connections,
// framing, a window of unacknowledged blocks, an optional rate limit,
// keepalive and stall detection.
//
// Who calls it: the recovery drivers on the source and destination nodes. The
// protocol logic stays in package recovery; this package only carries frames.
//
// A Conn carries one frame per Send and reads one per Recv: no queue of
// its own. The window of unacknowledged blocks is the recovery source's
// (recovery.SourceConfig.WindowBlocksMax), so flow control is decided in
// one place, by the state machine that knows what a block is.
//
// Invariants:
//   - No unbounded buffer: Send writes its frame before returning, Recv
//     reads exactly one frame of at most wire.FrameBytesMax.
//   - A link on which no frame arrives for the stall window fails Recv with
//     ErrStalled, never leaves it hanging; the processors' heartbeats keep a
//     quiet but healthy link well inside the window.
//   - A frame that does not decode is wire's error, distinct from a broken
//     link (an EOF or reset) and from this side's own Close (ErrClosed).
//   - Listens on loopback unless told otherwise.
//   - Over TLS (Dial with Config.TLS, Client, Server), the records of one
//     write leave in one system call of up to sixteen records (a 256 KiB
//     rejoin block), and reads take up to sixteen at once, into a buffer
//     that grows from four records only on a connection whose reads fill
//     it: crypto/tls alone makes a system call per 16 KiB record. Nothing
//     is held past the write that made it.
//
// Status: frames over TCP, stall detection, rate limit and keepalive are
// built. The protocol side of resuming on a new connection is too
// (recovery.Source.Resume and Destination.Resume resend at most one
// window); the driver that redials, and the source keeping a dropped
// stream for a grace period, come with the cluster issue.
package stream
