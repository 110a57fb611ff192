// Package stream moves wire frames between two processes: TCP connections,
// framing, a window of unacknowledged blocks, an optional rate limit,
// keepalive and stall detection.
//
// Who calls it: the recovery drivers on the source and destination nodes. The
// protocol logic stays in package recovery; this package only carries frames.
//
// Invariants:
//   - No unbounded buffer: at most WindowBlocksMax blocks are unacknowledged,
//     and a frame is never larger than wire.FrameBytesMax.
//   - A stream that makes no progress for its stall window is aborted with a
//     clear error, never left hanging.
//   - Listens on loopback unless told otherwise.
//
// Status: specified here, built by the cluster issue.
package stream
