package wire

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The msgpack primitives that tuples and messages are built from. Writers
// always pick the shortest form; readers accept only that form, so every
// value has exactly one encoding (see ErrNonCanonical).

// appendInt appends v in the shortest msgpack int form, choosing between
// the signed and unsigned forms as msgpack.Encoder.EncodeInt does:
// non-negative values always take the unsigned forms.
func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return appendUint(dst, uint64(v))
	}
	switch {
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, 0xd1), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
}

// appendUint appends v in the shortest msgpack unsigned form.
func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v <= math.MaxInt8:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xcf), v)
}

// appendStrHeader appends the shortest str header for n bytes; n must be
// at most math.MaxUint32.
func appendStrHeader(dst []byte, n int) []byte {
	switch {
	case n < 32:
		return append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		return append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xda), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
}

// appendBinHeader appends the shortest bin header for n bytes; n must be
// at most math.MaxUint32.
func appendBinHeader(dst []byte, n int) []byte {
	switch {
	case n <= math.MaxUint8:
		return append(dst, 0xc4, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xc5), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xc6), uint32(n))
}

// AppendArrayHeader appends a msgpack array header for n elements, 0 <= n
// <= math.MaxUint32, in the canonical (shortest) form. A block of tuples is this header followed by
// n tuples, so a block can be cut from stored tuples by copying bytes.
func AppendArrayHeader(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return append(dst, 0xdc, byte(n>>8), byte(n))
	default:
		return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
	}
}

// ReadArrayHeader reads a canonical msgpack array header from the front
// of b and returns the element count and the header's length.
func ReadArrayHeader(b []byte) (n, size int, err error) {
	if len(b) == 0 {
		return 0, 0, ErrTruncated
	}
	c := b[0]
	switch {
	case c&0xf0 == 0x90:
		return int(c & 0x0f), 1, nil
	case c == 0xdc:
		if len(b) < 3 {
			return 0, 0, ErrTruncated
		}
		n = int(binary.BigEndian.Uint16(b[1:]))
		if n < 16 {
			return 0, 0, fmt.Errorf("%w: array16 of %d", ErrNonCanonical, n)
		}
		return n, 3, nil
	case c == 0xdd:
		if len(b) < 5 {
			return 0, 0, ErrTruncated
		}
		u := binary.BigEndian.Uint32(b[1:])
		if u <= math.MaxUint16 {
			return 0, 0, fmt.Errorf("%w: array32 of %d", ErrNonCanonical, u)
		}
		if uint64(u) > uint64(len(b)) {
			// Every element takes at least one byte.
			return 0, 0, fmt.Errorf("%w: array of %d elements in %d bytes", ErrTruncated, u, len(b))
		}
		return int(u), 5, nil
	}
	return 0, 0, fmt.Errorf("%w: code 0x%02x is not an array", ErrMalformed, c)
}

// readInt decodes a canonical msgpack int at the front of b.
func readInt(b []byte) (v int64, size int, err error) {
	c := b[0]
	need := 1
	switch c {
	case 0xcc, 0xd0:
		need = 2
	case 0xcd, 0xd1:
		need = 3
	case 0xce, 0xd2:
		need = 5
	case 0xcf, 0xd3:
		need = 9
	default:
		if c <= 0x7f || c >= 0xe0 {
			return int64(int8(c)), 1, nil
		}
		return 0, 0, fmt.Errorf("%w: code 0x%02x for int64", ErrMalformed, c)
	}
	if len(b) < need {
		return 0, 0, ErrTruncated
	}
	var canonical bool
	switch c {
	case 0xcc:
		v = int64(b[1])
		canonical = v > math.MaxInt8
	case 0xcd:
		v = int64(binary.BigEndian.Uint16(b[1:]))
		canonical = v > math.MaxUint8
	case 0xce:
		v = int64(binary.BigEndian.Uint32(b[1:]))
		canonical = v > math.MaxUint16
	case 0xcf:
		u := binary.BigEndian.Uint64(b[1:])
		if u > math.MaxInt64 {
			return 0, 0, fmt.Errorf("%w: uint64 %d overflows int64", ErrMalformed, u)
		}
		v = int64(u)
		canonical = v > math.MaxUint32
	case 0xd0:
		v = int64(int8(b[1]))
		canonical = v < -32
	case 0xd1:
		v = int64(int16(binary.BigEndian.Uint16(b[1:])))
		canonical = v < math.MinInt8
	case 0xd2:
		v = int64(int32(binary.BigEndian.Uint32(b[1:])))
		canonical = v < math.MinInt16
	case 0xd3:
		v = int64(binary.BigEndian.Uint64(b[1:]))
		canonical = v < math.MinInt32
	}
	if !canonical {
		return 0, 0, fmt.Errorf("%w: int %d in code 0x%02x", ErrNonCanonical, v, c)
	}
	return v, need, nil
}

// strLen returns the header length and payload length of a canonical str.
func strLen(b []byte) (hdr, n int, err error) {
	c := b[0]
	switch {
	case c&0xe0 == 0xa0:
		hdr, n = 1, int(c&0x1f)
	case c == 0xd9:
		if len(b) < 2 {
			return 0, 0, ErrTruncated
		}
		hdr, n = 2, int(b[1])
		if n < 32 {
			return 0, 0, fmt.Errorf("%w: str8 of %d", ErrNonCanonical, n)
		}
	case c == 0xda:
		if len(b) < 3 {
			return 0, 0, ErrTruncated
		}
		hdr, n = 3, int(binary.BigEndian.Uint16(b[1:]))
		if n <= math.MaxUint8 {
			return 0, 0, fmt.Errorf("%w: str16 of %d", ErrNonCanonical, n)
		}
	case c == 0xdb:
		if len(b) < 5 {
			return 0, 0, ErrTruncated
		}
		u := binary.BigEndian.Uint32(b[1:])
		if u <= math.MaxUint16 {
			return 0, 0, fmt.Errorf("%w: str32 of %d", ErrNonCanonical, u)
		}
		if uint64(u) > uint64(len(b)) {
			return 0, 0, ErrTruncated
		}
		hdr, n = 5, int(u)
	default:
		return 0, 0, fmt.Errorf("%w: code 0x%02x for string", ErrMalformed, c)
	}
	if hdr+n > len(b) {
		return 0, 0, ErrTruncated
	}
	return hdr, n, nil
}

// binLen returns the header length and payload length of a canonical bin.
func binLen(b []byte) (hdr, n int, err error) {
	switch b[0] {
	case 0xc4:
		if len(b) < 2 {
			return 0, 0, ErrTruncated
		}
		hdr, n = 2, int(b[1])
	case 0xc5:
		if len(b) < 3 {
			return 0, 0, ErrTruncated
		}
		hdr, n = 3, int(binary.BigEndian.Uint16(b[1:]))
		if n <= math.MaxUint8 {
			return 0, 0, fmt.Errorf("%w: bin16 of %d", ErrNonCanonical, n)
		}
	case 0xc6:
		if len(b) < 5 {
			return 0, 0, ErrTruncated
		}
		u := binary.BigEndian.Uint32(b[1:])
		if u <= math.MaxUint16 {
			return 0, 0, fmt.Errorf("%w: bin32 of %d", ErrNonCanonical, u)
		}
		if uint64(u) > uint64(len(b)) {
			return 0, 0, ErrTruncated
		}
		hdr, n = 5, int(u)
	default:
		return 0, 0, fmt.Errorf("%w: code 0x%02x for bytes", ErrMalformed, b[0])
	}
	if hdr+n > len(b) {
		return 0, 0, ErrTruncated
	}
	return hdr, n, nil
}

// readUint decodes a canonical msgpack unsigned int at the front of b. The
// signed forms are refused: appendUint never writes them.
func readUint(b []byte) (v uint64, size int, err error) {
	if len(b) == 0 {
		return 0, 0, ErrTruncated
	}
	c := b[0]
	if c <= 0x7f {
		return uint64(c), 1, nil
	}
	var need int
	switch c {
	case 0xcc:
		need = 2
	case 0xcd:
		need = 3
	case 0xce:
		need = 5
	case 0xcf:
		need = 9
	default:
		return 0, 0, fmt.Errorf("%w: code 0x%02x for unsigned int", ErrMalformed, c)
	}
	if len(b) < need {
		return 0, 0, ErrTruncated
	}
	var least uint64
	switch c {
	case 0xcc:
		v, least = uint64(b[1]), math.MaxInt8+1
	case 0xcd:
		v, least = uint64(binary.BigEndian.Uint16(b[1:])), math.MaxUint8+1
	case 0xce:
		v, least = uint64(binary.BigEndian.Uint32(b[1:])), math.MaxUint16+1
	case 0xcf:
		v, least = binary.BigEndian.Uint64(b[1:]), math.MaxUint32+1
	}
	if v < least {
		return 0, 0, fmt.Errorf("%w: uint %d in code 0x%02x", ErrNonCanonical, v, c)
	}
	return v, need, nil
}
