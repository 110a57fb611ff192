package wire

import (
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// Codec names how a frame's payload is compressed. The numbers are part of
// the wire format; never renumber.
type Codec uint8

const (
	// CodecNone: the payload is the encoded message.
	CodecNone Codec = 0
	// CodecS2: the payload is one S2 block (github.com/klauspost/compress/s2,
	// block format, not the stream format: the frame already has a length
	// and a checksum). Fast enough to keep up with a 10 Gb/s link on one
	// core; the default for blocks.
	CodecS2 Codec = 1
	// CodecZstd: the payload is one zstd frame (SpeedFastest, no zstd
	// checksum, the frame has one). Smaller than S2 at a few times the CPU,
	// for slow links.
	CodecZstd Codec = 2
)

func (c Codec) String() string {
	switch c {
	case CodecNone:
		return "none"
	case CodecS2:
		return "s2"
	case CodecZstd:
		return "zstd"
	}
	return "codec(" + strconv.Itoa(int(c)) + ")"
}

// Valid reports whether c is a known codec.
func (c Codec) Valid() bool { return c <= CodecZstd }

// frameCompressBytesMin: shorter payloads go out uncompressed whatever the
// codec asked, because the compressor's own framing would eat the gain
// (control messages are 5-40 bytes).
const frameCompressBytesMin = 128

// The zstd encoder and decoder are expensive to create (tables, history
// buffers) and cheap to keep, so the package shares one of each, created
// on first use. EncodeAll and DecodeAll are safe for concurrent use: each
// call takes one of the library's internal per-goroutine states and runs on
// the caller's goroutine (no goroutines are started, as long as nobody
// uses the streaming API on them). Concurrent calls beyond GOMAXPROCS
// (encoder) or min(4, GOMAXPROCS) (decoder) wait for a free state.
var (
	zstdEncoder = sync.OnceValue(func() *zstd.Encoder {
		e, err := zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderCRC(false),
		)
		if err != nil {
			panic("wire: zstd encoder options: " + err.Error())
		}
		return e
	})
	zstdDecoder = sync.OnceValue(func() *zstd.Decoder {
		d, err := zstd.NewReader(nil,
			// The limits apply to DecodeAll as a whole; decompress sets
			// the per-frame limit through dst's capacity.
			zstd.WithDecoderMaxMemory(FramePayloadRawBytesMax),
			zstd.WithDecoderMaxWindow(FramePayloadRawBytesMax),
			zstd.WithDecodeAllCapLimit(true),
		)
		if err != nil {
			panic("wire: zstd decoder options: " + err.Error())
		}
		return d
	})
)

// compress appends src compressed with c (not CodecNone) to dst.
func compress(dst, src []byte, c Codec) []byte {
	switch c {
	case CodecS2:
		// s2.Encode writes in place only into a slice whose length is
		// MaxEncodedLen; src is at most FramePayloadRawBytesMax, far below
		// the 4 GiB where MaxEncodedLen gives up.
		n := s2.MaxEncodedLen(len(src))
		dst = slices.Grow(dst, n)
		out := s2.Encode(dst[len(dst):len(dst)+n], src)
		return dst[:len(dst)+len(out)]
	case CodecZstd:
		return zstdEncoder().EncodeAll(src, dst)
	}
	panic(fmt.Sprintf("wire: compress with %v", c))
}

// decompress decodes src, compressed with c (not CodecNone), into dst,
// which must have room for rawLen bytes, and returns dst[:rawLen]. It
// fails with ErrCodec unless src decodes to exactly rawLen bytes, and never
// writes more than rawLen bytes into dst; zstd may decode one zstd block
// (at most 128 KiB) past that into a buffer of its own before it notices.
func decompress(dst, src []byte, c Codec, rawLen int) ([]byte, error) {
	switch c {
	case CodecS2:
		n, err := s2.DecodedLen(src)
		if err != nil {
			return nil, fmt.Errorf("%w: s2: %v", ErrCodec, err)
		}
		if n != rawLen {
			return nil, fmt.Errorf("%w: s2 block of %d bytes, header says %d", ErrCodec, n, rawLen)
		}
		out, err := s2.Decode(dst[:rawLen], src)
		if err != nil {
			return nil, fmt.Errorf("%w: s2: %v", ErrCodec, err)
		}
		return out, nil
	case CodecZstd:
		out, err := zstdDecoder().DecodeAll(src, dst[:0:rawLen])
		if err != nil {
			return nil, fmt.Errorf("%w: zstd: %v", ErrCodec, err)
		}
		if len(out) != rawLen {
			return nil, fmt.Errorf("%w: zstd frame of %d bytes, header says %d", ErrCodec, len(out), rawLen)
		}
		return out, nil
	}
	panic(fmt.Sprintf("wire: decompress with %v", c))
}
