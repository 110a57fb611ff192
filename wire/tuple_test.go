package wire

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

var allTypes = []Type{TypeInt64, TypeFloat64, TypeString, TypeBytes}

func TestTupleRoundTripAndMsgpackCompatible(t *testing.T) {
	ints := []int64{0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	lens := []int{0, 1, 31, 32, 255, 256, 65535, 65536}
	enc := NewTupleEncoder()
	for _, iv := range ints {
		for _, l := range lens {
			s := string(make([]byte, l))
			bs := make([]byte, l)
			vals := []Value{Int64(iv), Float64(float64(iv) / 3), String(s), Bytes(bs)}
			b, err := enc.AppendTuple(nil, vals)
			if err != nil {
				t.Fatal(err)
			}
			// The library's own decoder must read our bytes as the same values.
			var generic []any
			if err := msgpack.Unmarshal(b, &generic); err != nil {
				t.Fatalf("msgpack rejects our tuple: %v", err)
			}
			if len(generic) != 4 {
				t.Fatalf("msgpack sees %d fields", len(generic))
			}
			n, err := ScanTuple(b, allTypes, nil)
			if err != nil || n != len(b) {
				t.Fatalf("ScanTuple(%d,%d) = %d, %v; want %d", iv, l, n, err, len(b))
			}
			got, n, err := DecodeTuple(b, allTypes, nil)
			if err != nil || n != len(b) {
				t.Fatalf("DecodeTuple = %d, %v", n, err)
			}
			for i := range vals {
				if !got[i].Equal(vals[i]) {
					t.Fatalf("field %d: got %v want %v", i, got[i], vals[i])
				}
			}
			for cut := 0; cut < len(b); cut++ {
				if _, err := ScanTuple(b[:cut], allTypes, nil); !errors.Is(err, ErrTruncated) {
					t.Fatalf("cut at %d of %d: err %v, want ErrTruncated", cut, len(b), err)
				}
			}
		}
	}
}

func TestTupleRejectsNonCanonical(t *testing.T) {
	// msgpack's own encoder with fixed-width ints writes a valid but
	// non-canonical form; replicas hashing stored bytes must refuse it.
	b, err := msgpack.Marshal([]any{int64(5)})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(b, []byte{0x91, 0xd3, 0, 0, 0, 0, 0, 0, 0, 5}) {
		t.Fatalf("unexpected msgpack bytes %x", b)
	}
	if _, err := ScanTuple(b, []Type{TypeInt64}, nil); !errors.Is(err, ErrNonCanonical) {
		t.Fatalf("err %v, want ErrNonCanonical", err)
	}
}

func TestAppendKeyEqualsEncodedKey(t *testing.T) {
	enc := NewTupleEncoder()
	row := []Value{String("k"), Int64(7), Bytes([]byte("v")), Int64(-9)}
	types := []Type{TypeString, TypeInt64, TypeBytes, TypeInt64}
	b, _ := enc.AppendTuple(nil, row)
	offs := make([]int, len(types)+1)
	if _, err := ScanTuple(b, types, offs); err != nil {
		t.Fatal(err)
	}
	key := AppendKey(nil, b, offs, []int{3, 0})
	want, _ := enc.AppendTuple(nil, []Value{Int64(-9), String("k")})
	if !reflect.DeepEqual(key, want) {
		t.Fatalf("key %x, want %x", key, want)
	}
}

// msgpackTuple encodes vals with the msgpack library's own encoder, the
// reference the hand-written TupleEncoder must match byte for byte.
func msgpackTuple(t testing.TB, vals []Value) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(enc.EncodeArrayLen(len(vals)))
	for _, v := range vals {
		switch v.Type {
		case TypeInt64:
			must(enc.EncodeInt(v.Int))
		case TypeFloat64:
			must(enc.EncodeFloat64(v.Float))
		case TypeString:
			must(enc.EncodeString(v.Str))
		case TypeBytes:
			must(enc.EncodeBytesLen(len(v.Bytes)))
			buf.Write(v.Bytes)
		}
	}
	return buf.Bytes()
}

func TestTupleEncoderMatchesMsgpack(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	lens := []int{0, 1, 31, 32, 255, 256, 65535, 65536}
	var e TupleEncoder
	for range 2000 {
		vals := make([]Value, rng.IntN(20))
		for i := range vals {
			switch Type(rng.IntN(4) + 1) {
			case TypeInt64:
				// Spread over every magnitude so every int form comes up.
				v := int64(rng.Uint64() >> rng.IntN(64))
				if rng.IntN(2) == 0 {
					v = -v
				}
				vals[i] = Int64(v)
			case TypeFloat64:
				vals[i] = Float64(math.Float64frombits(rng.Uint64()))
			case TypeString:
				vals[i] = String(strings.Repeat("s", lens[rng.IntN(len(lens))]))
			case TypeBytes:
				vals[i] = Bytes(make([]byte, lens[rng.IntN(len(lens))]))
			}
		}
		got, err := e.AppendTuple(nil, vals)
		if err != nil {
			t.Fatal(err)
		}
		if want := msgpackTuple(t, vals); !bytes.Equal(got, want) {
			t.Fatalf("%v:\nours    %x\nmsgpack %x", vals, got, want)
		}
	}
	for _, v := range []int64{0, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64} {
		vals := []Value{Int64(v)}
		if got, _ := e.AppendTuple(nil, vals); !bytes.Equal(got, msgpackTuple(t, vals)) {
			t.Fatalf("int %d: ours %x", v, got)
		}
	}
}

func TestAppendTupleErrorsLeaveDst(t *testing.T) {
	var e TupleEncoder
	dst := []byte("abc")
	for _, vals := range [][]Value{
		{Int64(1), {Type: 0}},
		make([]Value, TupleFieldsMax+1),
	} {
		out, err := e.AppendTuple(dst, vals)
		if !errors.Is(err, ErrMalformed) || string(out) != "abc" {
			t.Fatalf("AppendTuple = %q, %v", out, err)
		}
	}
}

func TestScanTuples(t *testing.T) {
	tuples := sampleTuples(t, 20)
	if err := ScanTuples(tuples, 20); err != nil {
		t.Fatal(err)
	}
	if err := ScanTuples([]byte{0x90}, 0); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		b     []byte
		count int
		want  error
	}{
		{"count differs", tuples, 19, ErrMalformed},
		{"trailing", append(bytes.Clone(tuples), 0x90), 20, ErrMalformed},
		{"empty", nil, 0, ErrTruncated},
		{"cut", tuples[:len(tuples)-1], 20, ErrTruncated},
		{"scalar, not array", []byte{0x07}, 0, ErrMalformed},
	} {
		if err := ScanTuples(tt.b, tt.count); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	if n := testing.AllocsPerRun(10, func() { _ = ScanTuples(tuples, 20) }); n != 0 && !raceEnabled {
		t.Fatalf("ScanTuples allocates %v", n)
	}
}
