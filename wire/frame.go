package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
)

// Frame limits. A frame header announcing more is refused with ErrTooLarge
// before anything is read or allocated, so a reader's buffers are bounded
// by these. FrameBytesMax equals FramePayloadRawBytesMax because a frame
// never carries a compressed payload that is not smaller than its message
// (it goes out uncompressed instead).
const (
	// FrameHeaderBytes is the fixed length of a frame header.
	FrameHeaderBytes = 14
	// FrameBytesMax bounds a frame's payload as sent.
	FrameBytesMax = 8 << 20
	// FramePayloadRawBytesMax bounds a frame's payload after decompression,
	// which is the encoded message. Blocks are cut well below it (256 KiB
	// to 4 MiB).
	FramePayloadRawBytesMax = 8 << 20
)

// Offsets in the frame header. The checksum covers bytes [0, frameSumAt)
// as well as the payload.
const (
	framePayloadLenAt = 0
	frameTypeAt       = 4
	frameCodecAt      = 5
	frameRawLenAt     = 6
	frameSumAt        = 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// frameChecksum is the CRC-32C of the header's first ten bytes and then the
// payload. Covering the header too means a flipped bit in the type (Ack
// and Heartbeat have the same layout), the codec or the raw length is caught
// as ErrChecksum rather than read as a different, valid frame.
func frameChecksum(head, payload []byte) uint32 {
	return crc32.Update(crc32.Checksum(head[:frameSumAt], castagnoli), castagnoli, payload)
}

// FrameHeader is a parsed frame header. The lengths are bounded by the
// limits above once ParseFrameHeader accepted them.
type FrameHeader struct {
	// PayloadBytes is the length of the payload as sent.
	PayloadBytes int
	Type         MsgType
	Codec        Codec
	// RawBytes is the length of the payload after decompression; equal to
	// PayloadBytes for CodecNone.
	RawBytes int
	// Checksum is the CRC-32C of the header's first ten bytes and the
	// payload as sent.
	Checksum uint32
}

// FrameBytes returns the length of the whole frame, header included.
func (h FrameHeader) FrameBytes() int { return FrameHeaderBytes + h.PayloadBytes }

// appendTo appends the header's first ten bytes (everything before the
// checksum) as they were on the wire.
func (h FrameHeader) appendTo(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(h.PayloadBytes))
	dst = append(dst, byte(h.Type), byte(h.Codec))
	return binary.BigEndian.AppendUint32(dst, uint32(h.RawBytes))
}

// ParseFrameHeader parses the frame header at the front of b, so that a
// reader can then read exactly h.PayloadBytes more. It checks everything
// the header alone can show (limits, type, codec) and nothing about the
// payload; the checksum is checked by DecodePayload or DecodeFrame.
func ParseFrameHeader(b []byte) (FrameHeader, error) {
	if len(b) < FrameHeaderBytes {
		return FrameHeader{}, fmt.Errorf("%w: frame header of %d bytes, have %d", ErrTruncated, FrameHeaderBytes, len(b))
	}
	payloadLen := binary.BigEndian.Uint32(b[framePayloadLenAt:])
	rawLen := binary.BigEndian.Uint32(b[frameRawLenAt:])
	h := FrameHeader{
		PayloadBytes: int(payloadLen),
		Type:         MsgType(b[frameTypeAt]),
		Codec:        Codec(b[frameCodecAt]),
		RawBytes:     int(rawLen),
		Checksum:     binary.BigEndian.Uint32(b[frameSumAt:]),
	}
	switch {
	case payloadLen > FrameBytesMax:
		return FrameHeader{}, fmt.Errorf("%w: frame payload of %d bytes, limit %d", ErrTooLarge, payloadLen, FrameBytesMax)
	case rawLen > FramePayloadRawBytesMax:
		return FrameHeader{}, fmt.Errorf("%w: frame raw payload of %d bytes, limit %d", ErrTooLarge, rawLen, FramePayloadRawBytesMax)
	case !h.Type.Valid():
		return FrameHeader{}, fmt.Errorf("%w: %d in frame header", ErrUnknownType, uint8(h.Type))
	case !h.Codec.Valid():
		return FrameHeader{}, fmt.Errorf("%w: %d in frame header", ErrUnknownCodec, uint8(h.Codec))
	case h.Codec == CodecNone && rawLen != payloadLen:
		return FrameHeader{}, fmt.Errorf("%w: uncompressed frame of %d bytes says %d raw", ErrMalformed, payloadLen, rawLen)
	}
	return h, nil
}

// sealFrame fills in the header of frame, whose payload already follows
// the header's FrameHeaderBytes.
func sealFrame(frame []byte, t MsgType, codec Codec, rawLen int) {
	payload := frame[FrameHeaderBytes:]
	h := FrameHeader{PayloadBytes: len(payload), Type: t, Codec: codec, RawBytes: rawLen}
	h.appendTo(frame[:0])
	binary.BigEndian.PutUint32(frame[frameSumAt:], frameChecksum(frame, payload))
}

// appendCompressedFrame appends a frame of the encoded message raw,
// compressed with codec, to dst and reports true; or, when compression
// would not make the payload smaller (or raw is too short to try), returns
// dst unchanged and false.
func appendCompressedFrame(dst []byte, t MsgType, codec Codec, raw []byte) ([]byte, bool) {
	if len(raw) < frameCompressBytesMin {
		return dst, false
	}
	at := len(dst)
	dst = append(dst, make([]byte, FrameHeaderBytes)...)
	dst = compress(dst, raw, codec)
	if len(dst)-at-FrameHeaderBytes >= len(raw) {
		return dst[:at], false
	}
	sealFrame(dst[at:], t, codec, len(raw))
	return dst, true
}

// FrameEncoder appends messages as frames. It keeps the scratch buffer a
// compressed frame's message is encoded into; the zero value is ready and
// it is not safe for concurrent use (give each connection its own).
type FrameEncoder struct {
	raw []byte
}

// AppendFrame appends m as one frame to dst. The payload is compressed
// with codec unless that does not make it smaller, in which case the frame
// says CodecNone: the receiver reads the codec from each frame, and an
// incompressible block costs no decompression. Errors: ErrUnknownCodec,
// ErrTooLarge (the message is over FramePayloadRawBytesMax, or a cluster
// message field over its limit, see ProcTupleBytesMax); dst is then
// returned unchanged.
func (e *FrameEncoder) AppendFrame(dst []byte, m Message, codec Codec) ([]byte, error) {
	if !codec.Valid() {
		return dst, fmt.Errorf("%w: %d", ErrUnknownCodec, uint8(codec))
	}
	if err := checkClusterLimits(m); err != nil {
		return dst, err
	}
	at := len(dst)
	if codec == CodecNone {
		// Encode in place behind a gap for the header: no scratch, no copy.
		dst = append(dst, make([]byte, FrameHeaderBytes)...)
		dst = AppendMessage(dst, m)
		rawLen := len(dst) - at - FrameHeaderBytes
		if rawLen > FramePayloadRawBytesMax {
			return dst[:at], tooLarge(m, rawLen)
		}
		sealFrame(dst[at:], m.Type(), CodecNone, rawLen)
		return dst, nil
	}
	e.raw = AppendMessage(e.raw[:0], m)
	if len(e.raw) > FramePayloadRawBytesMax {
		return dst, tooLarge(m, len(e.raw))
	}
	if out, ok := appendCompressedFrame(dst, m.Type(), codec, e.raw); ok {
		return out, nil
	}
	dst = append(dst, make([]byte, FrameHeaderBytes)...)
	dst = append(dst, e.raw...)
	sealFrame(dst[at:], m.Type(), CodecNone, len(e.raw))
	return dst, nil
}

func tooLarge(m Message, n int) error {
	return fmt.Errorf("%w: %v message of %d bytes, limit %d", ErrTooLarge, m.Type(), n, FramePayloadRawBytesMax)
}

// AppendFrame appends m as one frame to dst; see FrameEncoder.AppendFrame.
// It allocates a scratch buffer for a compressed frame on every call: a
// connection should keep a FrameEncoder.
func AppendFrame(dst []byte, m Message, codec Codec) ([]byte, error) {
	var e FrameEncoder
	return e.AppendFrame(dst, m, codec)
}

// FrameDecoder decodes frames. It keeps the buffer compressed payloads
// are decompressed into, so a message decoded from a compressed frame (a
// Block's Tuples) aliases that buffer and is valid only until the next
// call. The zero value is ready; it is not safe for concurrent use.
type FrameDecoder struct {
	raw  []byte
	head [frameSumAt]byte // the checksummed header bytes; a local would escape into crc32
}

// DecodeFrame decodes the frame at the front of b and returns its message
// and the frame's length. Errors, in the order checked:
//   - ErrTruncated: b holds less than one whole frame (only then);
//   - ErrTooLarge, ErrUnknownType, ErrUnknownCodec, ErrMalformed: the header
//     is impossible (see ParseFrameHeader);
//   - ErrChecksum: the header or the payload was damaged;
//   - ErrCodec: the payload does not decompress to the announced length;
//   - ErrMalformed, ErrNonCanonical, ErrTooLarge: the message does not
//     decode (see DecodeMessage).
//
// A decoded Block's Tuples aliases b for an uncompressed frame, or the
// decoder's buffer for a compressed one.
func (d *FrameDecoder) DecodeFrame(b []byte) (Message, int, error) {
	h, err := ParseFrameHeader(b)
	if err != nil {
		return nil, 0, err
	}
	n := h.FrameBytes()
	if len(b) < n {
		return nil, 0, fmt.Errorf("%w: frame of %d bytes, have %d", ErrTruncated, n, len(b))
	}
	m, err := d.DecodePayload(h, b[FrameHeaderBytes:n])
	if err != nil {
		return nil, 0, err
	}
	return m, n, nil
}

// DecodePayload decodes the payload of a frame whose header h was parsed
// by ParseFrameHeader, for a reader that keeps header and payload apart.
// payload must be exactly h.PayloadBytes long. Errors and aliasing as for
// DecodeFrame, except that a short payload is ErrTruncated.
func (d *FrameDecoder) DecodePayload(h FrameHeader, payload []byte) (Message, error) {
	if len(payload) != h.PayloadBytes {
		return nil, fmt.Errorf("%w: frame payload of %d bytes, have %d", ErrTruncated, h.PayloadBytes, len(payload))
	}
	if sum := frameChecksum(h.appendTo(d.head[:0]), payload); sum != h.Checksum {
		return nil, fmt.Errorf("%w: %v frame of %d bytes: crc32c %08x, header says %08x", ErrChecksum, h.Type, h.PayloadBytes, sum, h.Checksum)
	}
	raw := payload
	if h.Codec != CodecNone {
		if cap(d.raw) < h.RawBytes {
			d.raw = make([]byte, h.RawBytes)
		}
		var err error
		if raw, err = decompress(d.raw, payload, h.Codec, h.RawBytes); err != nil {
			return nil, fmt.Errorf("%w (%v frame)", err, h.Type)
		}
	}
	m, err := DecodeMessage(h.Type, raw)
	if err != nil {
		// The frame is whole, so a message that ends early is malformed;
		// reporting ErrTruncated would invite the reader to wait for more.
		if errors.Is(err, ErrTruncated) {
			return nil, fmt.Errorf("%w: %v message ends early: %s", ErrMalformed, h.Type, strings.TrimPrefix(err.Error(), "wire: "))
		}
		return nil, err
	}
	return m, nil
}

// DecodeFrame decodes the frame at the front of b; see
// FrameDecoder.DecodeFrame. It allocates a fresh buffer for a compressed
// payload on every call, which the returned message may alias.
func DecodeFrame(b []byte) (Message, int, error) {
	var d FrameDecoder
	return d.DecodeFrame(b)
}
