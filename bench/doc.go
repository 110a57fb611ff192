// Package bench holds the workloads and measurements shared by the Go
// benchmarks and `rejoin bench`: the binary only binds flags to a config,
// the work lives here, so a figure from either comes from the same code.
// Sub-benchmarks are named key=value (rows=1e6/writer=on) so benchstat can
// compare runs. Speed is measured here, never asserted by a timed test.
//
// # The in-process rejoin
//
// RunRejoin (or NewRejoin, then Run, to keep loading out of a timer) runs
// one whole rejoin of one partition inside the process, with the real
// protocol code and a real thin driver around it:
//
//   - The source partition holds one table of Rows rows, a KeyBytes bytes
//     key and a ValueBytes bytes value (16 and 100 by default; values are
//     64% repeated patterns and 36% random, so a codec has something to do
//     but not everything).
//   - Two goroutines, the source's and the destination's, each drive one
//     replica core (recovery.Replica, the one recovery/node runs), which
//     owns a partition.Executor and one recovery processor (Source,
//     Destination), as on two nodes. Each steps its core between inputs
//     (the core pumps the source after every txn), ticks it from a
//     time.Ticker (one tick is 1 ms), and
//     exchanges wire frames with the other over two bounded channels,
//     encoded, checksummed and compressed with FrameEncoder and
//     FrameDecoder exactly as they would go on a socket.
//   - An initiator goroutine drives the product's initiator core
//     (recovery.Initiator, as recovery/node and the simulator do), which
//     assigns txn IDs on the wall clock and sends every txn to every
//     replica: the source from the start, the destination from the
//     moment it joins the feed. In a tick without a txn it heartbeats. With Writer set it
//     offers upserts at a fixed rate, WriterTxnsPerSec (100,000 by
//     default), 90% to random existing keys and 10% to new ones.
//
// A run goes: load (NewRejoin); start the initiator and the source; with
// the writer, warm up and measure the source's executed txns per second
// over BeforeWindow; start the rejoin (the source gets ready to answer,
// the destination joins the feed and proposes), which is time zero; wait
// for the source's handoff and the destination live; stop the writer,
// which ends the feed with a read-only fence txn; let both replicas execute
// everything up to the fence; compare LastExecuted, row counts and
// partition digests. A difference is an error, as is an abort on either
// side, a driver error, or the Timeout. Every goroutine has ended when Run
// returns, on success and on every error.
//
// Both executors' queues are sized from the writer's rate: the destination
// buffers every txn from joining the feed until it goes live, so the bound
// is what the writer can offer until Timeout (RejoinConfig.QueueTxnsMax);
// a full buffer is then impossible before the run times out.
//
// # What the figures mean
//
//   - rows/s: the rows the destination holds when it goes live, over the
//     time from the start of the rejoin to live. The partition's size, not
//     the rows shipped, so catch-up re-sends do not inflate it; this is the
//     figure to hold against "a full sync of 5M keys took 10 s".
//   - MB/s: tuple bytes shipped (snapshot and catch-up rounds), over the
//     same time, in 10^6 bytes. RejoinResult.WireBytes has the frame bytes
//     after the codec.
//   - handoff-ms: the wall time the source held execution for the
//     handoff, from the start of the driver call in which its state became
//     handing-off until it was seen to have sent the Handoff (it executes
//     on while it awaits the destination's HandoffAck); so never
//     under-reported. It includes shipping the final delta and waiting
//     for window room.
//   - rounds: catch-up rounds, the final delta included (1 means the
//     snapshot was followed directly by the handoff's delta).
//   - write-ratio: the source's executed txns per second from the start of
//     the rejoin to its handoff, over the same before the rejoin. The
//     writer is open-loop at a fixed offered rate, so the ratio is 1 while
//     the source keeps up with its offered load, and falls below 1 when
//     the rejoin takes its CPU (cutting and encoding blocks), its throttle
//     paces or holds, or the handoff holds execution. It says nothing of
//     the source's capacity: offer more (WriterTxnsPerSec) to find where it
//     breaks. WriterOfferedPerSec shows whether the writer itself kept its
//     rate.
//
// # What they do not mean
//
// There is no network and no kernel: a link is a channel, so the figures
// exclude syscalls, TCP and bandwidth, and include the wire's CPU cost
// (copying, CRC-32C, the codec). Source, destination and initiator share
// the machine's cores; on a cluster they run on different nodes. On a
// 2-core machine the destination's applying takes one core and everything
// else shares the other, so the writer's load and the rejoin slow each
// other more than they would across nodes. Loading the source partition is
// not timed. A run is one sample: on a shared machine, repeat it and
// compare with benchstat before believing a difference of 20%.
//
// The destination's feed may lag the source's, so txns below the
// handoff's E can reach the destination after it went live. Their effect
// is in the state handed off; recovery.Destination takes them as
// heartbeats and counts them (RejoinResult.TxnsLate).
package bench
