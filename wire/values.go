package wire

import "fmt"

// DecodeValues decodes one canonical tuple of any field types from the front
// of b, as procedure parameters and results travel without a schema: the
// type of each field is read from its msgpack code. It returns the values
// (appended to dst[:0]) and the tuple's length. Bytes values alias b.
func DecodeValues(b []byte, dst []Value) ([]Value, int, error) {
	n, pos, err := ReadArrayHeader(b)
	if err != nil {
		return dst, 0, err
	}
	if n > TupleFieldsMax {
		return dst, 0, fmt.Errorf("%w: %d fields, limit %d", ErrMalformed, n, TupleFieldsMax)
	}
	dst = dst[:0]
	for i := 0; i < n; i++ {
		if pos >= len(b) {
			return dst, 0, ErrTruncated
		}
		t, err := typeOfCode(b[pos])
		if err != nil {
			return dst, 0, fmt.Errorf("%w (field %d)", err, i)
		}
		v, l, err := decodeField(b[pos:], t)
		if err != nil {
			return dst, 0, fmt.Errorf("%w (field %d)", err, i)
		}
		dst = append(dst, v)
		pos += l
	}
	return dst, pos, nil
}

// typeOfCode returns the column type whose canonical encoding begins with
// the msgpack code c.
func typeOfCode(c byte) (Type, error) {
	switch {
	case c <= 0x7f || c >= 0xe0, c >= 0xcc && c <= 0xd3:
		return TypeInt64, nil
	case c == 0xcb:
		return TypeFloat64, nil
	case c&0xe0 == 0xa0, c >= 0xd9 && c <= 0xdb:
		return TypeString, nil
	case c >= 0xc4 && c <= 0xc6:
		return TypeBytes, nil
	}
	return 0, fmt.Errorf("%w: code 0x%02x is no field type", ErrMalformed, c)
}
