package wire

import "errors"

// Error classes. Every error this package returns wraps exactly one of
// these, so callers classify with errors.Is and keep the text for logs.
var (
	// ErrTruncated: the input ends before the value it began. DecodeFrame
	// returns it only when b holds less than one whole frame, so a reader
	// may take it to mean "read more"; inside a whole frame a short value is
	// ErrMalformed, because no amount of further input would fix it.
	ErrTruncated = errors.New("wire: truncated")
	// ErrMalformed: the bytes are not of the expected shape (wrong msgpack
	// code, wrong field count, trailing bytes, a value out of range).
	ErrMalformed = errors.New("wire: malformed")
	// ErrNonCanonical: a valid msgpack value in a form our encoder never
	// writes. Rejected because replicas hash the stored bytes: a row that
	// arrived in another form would hash differently, and because it keeps
	// decode-then-encode an identity, which the fuzz targets rely on.
	ErrNonCanonical = errors.New("wire: non-canonical encoding")
	// ErrUnknownType: a frame or DecodeMessage names no known MsgType.
	ErrUnknownType = errors.New("wire: unknown message type")
	// ErrUnknownCodec: a frame names no known Codec.
	ErrUnknownCodec = errors.New("wire: unknown codec")
	// ErrChecksum: the frame's CRC-32C does not match; the frame was
	// damaged on the way and nothing in it can be trusted.
	ErrChecksum = errors.New("wire: checksum mismatch")
	// ErrTooLarge: a length is over one of the limits (FrameBytesMax,
	// FramePayloadRawBytesMax, AbortTextBytesMax, the cluster messages'
	// NodeBytesMax and the like). Decoders check lengths
	// before allocating, so this is how a hostile length shows up.
	ErrTooLarge = errors.New("wire: too large")
	// ErrCodec: a payload whose checksum is right did not decompress, or
	// decompressed to another length than its frame header says.
	ErrCodec = errors.New("wire: codec error")
)
