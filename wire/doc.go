// Package wire is the byte format of rejoin: the tuple format rows are
// stored and shipped in, the messages of the rejoin protocol, and the frame
// that carries one message with its compression and checksum. It does no
// I/O: byte slices in, byte slices out.
//
// # Who calls it
//
//   - partition stores every row as its canonical tuple bytes
//     (TupleEncoder.AppendTuple), checks incoming rows against a table's
//     schema with ScanTuple, and derives keys with AppendKey. The digest is
//     computed over these bytes, which is why the encoding must be unique.
//   - cow cuts snapshot and catch-up blocks by copying stored tuples into a
//     BlockWriter (AppendStored) until TupleBytes reaches the block budget,
//     then takes the Frame.
//   - recovery builds and consumes the protocol messages (Propose, Answer,
//     Block, Ack, Handoff, Abort, Heartbeat, Hold, HandoffAck) in its state
//     machines.
//   - recovery/node and recovery/client speak the cluster messages (Hello, Txn,
//     Beat, BeatAsk, FeedAck, Fenced, Done, Call, Reply, Repair, RepairEnd; cluster.go) over the same
//     frames.
//   - stream moves frames: it writes what AppendFrame or BlockWriter.Frame
//     returned, and reads FrameHeaderBytes, calls ParseFrameHeader, reads
//     exactly PayloadBytes more and calls FrameDecoder.DecodeFrame (or
//     DecodePayload).
//
// # Tuples
//
// A tuple is a msgpack array of its fields. Column types map to msgpack
// as int64 -> int, float64 -> float64, string -> str, bytes -> bin. A block's
// tuples are a msgpack array of tuples: AppendArrayHeader(n) followed by n
// stored tuples, so cutting a block is copying bytes.
//
// # Messages
//
// A message is a msgpack array of its fields in declaration order, the
// MsgHeader (fencing epoch, partition) first:
//
//	Propose   [epoch, partition, txnID]
//	Answer    [epoch, partition, txnID, rows]
//	Block     [epoch, partition, kind, table, seq, [tuple, tuple, ...]]
//	Ack       [epoch, partition, seq]
//	Handoff   [epoch, partition, txnID, digest, lastSeq, rows, [initiator, ...]]
//	Abort     [epoch, partition, reason, text]
//	Heartbeat [epoch, partition, tick]
//	Hold      [epoch, partition]   (type 16: added after the cluster messages)
//	HandoffAck [epoch, partition, txnID, digest]   (type 17, likewise)
//
// The cluster messages have no MsgHeader (Header returns the zero one;
// MsgType.Rejoin tells the two families apart):
//
//	Hello     [kind, node, initiator, partition, epoch, [missed, ...], resume, kept, to]
//	Txn       [partition, txnID, proc, params]
//	Beat      [txnID]
//	BeatAsk   [txnID]   (type 18: added after HandoffAck)
//	FeedAck   [txnID]   (type 19)
//	Fenced    [[partition, ...]]   (type 20)
//	Join      [partition]   (type 21)
//	Joined    [partition, txnID]   (type 22)
//	Done      [partition, txnID, out, err]
//	Call      [req, partition, proc, params, each]
//	Reply     [req, txnID, out, err, [[node, out, err], ...], uncertain, refused]
//	Repair    [partition, initiator, after, incarnation]
//	RepairEnd [partition, initiator, last, err]
//
// All numbers are msgpack unsigned ints; node, proc and err are str,
// params and out are bin holding a tuple, each and uncertain are bools;
// refused is a Refusal (0: none; a node's refusal of a call with nothing
// sequenced, told apart from a procedure's error without reading err). The
// message type is not in the message; the frame header carries it.
//
// # Frames
//
// A frame is a fixed 14-byte header and a payload, integers big-endian:
//
//	offset  size  field
//	     0     4  payload length in bytes, as sent (<= FrameBytesMax)
//	     4     1  message type (MsgType)
//	     5     1  codec (Codec: 0 none, 1 s2 block, 2 zstd frame)
//	     6     4  raw length: payload length after decompression
//	              (<= FramePayloadRawBytesMax; = payload length for none)
//	    10     4  CRC-32C (Castagnoli) of bytes 0-9, then of the payload
//	    14     n  payload: the encoded message, compressed by the codec
//
// The checksum is checked before decompressing, so a decompressor only
// ever sees bytes the sender wrote. It covers the header's first ten bytes
// too, so a damaged type or codec is caught rather than obeyed. A payload
// is sent uncompressed (codec none) when compression would not shrink it;
// receivers read the codec from each frame and need no configuration.
//
// # Invariants
//
//   - Canonical encoding: every value has one encoding, the shortest msgpack
//     form (ints, and str, bin and array headers), float64 always as
//     float64. Decoders refuse any other form with ErrNonCanonical. So
//     replicas hash equal rows to equal bytes, and decoding then encoding
//     any accepted message gives back the same bytes (the fuzz targets
//     check it).
//   - Decoding never panics and never allocates more than the input
//     implies: every length is checked against the input before it is used,
//     frame lengths against FrameBytesMax and FramePayloadRawBytesMax before
//     anything is allocated, and decompression cannot produce more than
//     the frame's raw length. Block tuples are checked in place, with no
//     allocation per tuple.
//   - Every error wraps one of ErrTruncated, ErrMalformed, ErrNonCanonical,
//     ErrUnknownType, ErrUnknownCodec, ErrChecksum, ErrTooLarge, ErrCodec.
//     DecodeFrame returns ErrTruncated only when its input holds less than
//     one frame.
//   - Decoded messages may alias their input: a Block's Tuples, and the
//     Params and Out of a cluster message, point into the frame, or into
//     the FrameDecoder's buffer for a compressed frame.
//   - Encoders panic only on a caller's bug (an unknown message type, a Block
//     whose Count and Tuples disagree, a Block or Hello of an invalid kind);
//     decoders return errors. AppendFrame refuses a cluster message field
//     over its limit with ErrTooLarge; error texts are cut to fit instead.
//
// Concurrency: FrameEncoder, FrameDecoder, BlockWriter and TupleEncoder
// each belong to one goroutine (one per connection). The zstd encoder and
// decoder behind them are shared package-wide, are safe for concurrent use
// and start no goroutines.
package wire
