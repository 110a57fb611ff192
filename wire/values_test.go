package wire

import (
	"errors"
	"testing"
)

func TestDecodeValuesRoundTrip(t *testing.T) {
	enc := NewTupleEncoder()
	vals := []Value{String("accounts"), Int64(-40000), Float64(2.5), Bytes([]byte{1, 2}), Int64(1 << 40), String("")}
	b, err := enc.AppendTuple(nil, vals)
	if err != nil {
		t.Fatal(err)
	}
	got, n, err := DecodeValues(b, nil)
	if err != nil || n != len(b) {
		t.Fatalf("DecodeValues = %d, %v", n, err)
	}
	if len(got) != len(vals) {
		t.Fatalf("got %d values, want %d", len(got), len(vals))
	}
	for i := range vals {
		if !got[i].Equal(vals[i]) {
			t.Errorf("field %d: got %v, want %v", i, got[i], vals[i])
		}
	}
	for cut := 0; cut < len(b); cut++ {
		if _, _, err := DecodeValues(b[:cut], nil); !errors.Is(err, ErrTruncated) {
			t.Fatalf("cut at %d: %v, want ErrTruncated", cut, err)
		}
	}
}

func TestDecodeValuesRejects(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"nil field", []byte{0x91, 0xc0}, ErrMalformed},
		{"float32", []byte{0x91, 0xca, 0, 0, 0, 0}, ErrMalformed},
		{"nested array", []byte{0x91, 0x90}, ErrMalformed},
		{"map", []byte{0x80}, ErrMalformed},
		{"long form of a small int", []byte{0x91, 0xcd, 0, 5}, ErrNonCanonical},
		{"huge array32", []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, ErrTruncated},
	}
	for _, tt := range tests {
		if _, _, err := DecodeValues(tt.in, nil); !errors.Is(err, tt.want) {
			t.Errorf("%s: err %v, want %v", tt.name, err, tt.want)
		}
	}
}
