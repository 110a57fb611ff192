package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// The fuzz targets check that decoding never panics, that every error is
// classified, and that whatever decodes re-encodes to the same message
// (and, being canonical, to the same bytes). Seeds live in
// testdata/fuzz/<FuzzName>/; -write-seeds regenerates the named ones.
//
//	go test -run=^$ -fuzz=^FuzzDecodeFrame$ -fuzztime=45s -parallel=1 ./wire/

var writeSeeds = flag.Bool("write-seeds", false, "rewrite the generated seed corpus under testdata/fuzz")

var errorClasses = []error{ErrTruncated, ErrMalformed, ErrNonCanonical, ErrUnknownType,
	ErrUnknownCodec, ErrChecksum, ErrTooLarge, ErrCodec}

func checkClassified(t *testing.T, err error) {
	t.Helper()
	for _, c := range errorClasses {
		if errors.Is(err, c) {
			return
		}
	}
	t.Fatalf("unclassified error: %v", err)
}

func FuzzDecodeFrame(f *testing.F) {
	for _, m := range allSampleMessages(f) {
		f.Add(mustFrame(f, m, CodecNone), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, fixSum bool) {
		if fixSum {
			// Let the fuzzer past the checksum, or it would never reach
			// the decompressors and the message decoder.
			b = resealPrefix(b)
		}
		var d FrameDecoder
		m, n, err := d.DecodeFrame(b)
		if err != nil {
			checkClassified(t, err)
			if m != nil || n != 0 {
				t.Fatalf("error %v with message %v, length %d", err, m, n)
			}
			return
		}
		h, err := ParseFrameHeader(b)
		if err != nil || n != h.FrameBytes() || n > len(b) {
			t.Fatalf("decoded %d bytes; header %+v, %v", n, h, err)
		}
		f2, err := AppendFrame(nil, m, h.Codec)
		if err != nil {
			t.Fatalf("re-encoding %v: %v", m, err)
		}
		m2, n2, err := DecodeFrame(f2)
		if err != nil || n2 != len(f2) || !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip: %+v became %+v, %v", m, m2, err)
		}
		if h.Codec == CodecNone && !bytes.Equal(f2, b[:n]) {
			t.Fatalf("uncompressed frame re-encodes differently:\n%x\n%x", b[:n], f2)
		}
	})
}

// resealPrefix returns b with the checksum of the frame it begins with
// made right, if b holds a whole frame.
func resealPrefix(b []byte) []byte {
	if len(b) < FrameHeaderBytes {
		return b
	}
	end := FrameHeaderBytes + int(binary.BigEndian.Uint32(b))
	if end > len(b) || end < FrameHeaderBytes {
		return b
	}
	b = bytes.Clone(b)
	reseal(b[:end])
	return b
}

func FuzzDecodeBlock(f *testing.F) {
	f.Add(AppendMessage(nil, sampleMessages(f)[2]))
	f.Fuzz(func(t *testing.T, payload []byte) {
		m, err := DecodeMessage(MsgBlock, payload)
		if err != nil {
			checkClassified(t, err)
			return
		}
		b := m.(*Block)
		if err := ScanTuples(b.Tuples, int(b.Count)); err != nil {
			t.Fatalf("decoded block fails ScanTuples: %v", err)
		}
		checkMessageRoundTrip(t, m, payload)
		// Each tuple, read with the schema its own type codes imply,
		// decodes and re-encodes to its own bytes.
		_, pos, _ := ReadArrayHeader(b.Tuples)
		for i := range int(b.Count) {
			n, err := scanTupleAny(b.Tuples[pos:])
			if err != nil {
				t.Fatalf("tuple %d: %v", i, err)
			}
			checkTupleRoundTrip(t, b.Tuples[pos:pos+n], inferTypes(t, b.Tuples[pos:pos+n]))
			pos += n
		}
	})
}

// controlTypes are the message types other than Block: the rejoin control
// messages and the cluster messages.
var controlTypes = []MsgType{MsgPropose, MsgAnswer, MsgAck, MsgHandoff, MsgAbort, MsgHeartbeat,
	MsgHello, MsgTxn, MsgBeat, MsgDone, MsgCall, MsgReply, MsgRepair, MsgRepairEnd, MsgHold, MsgHandoffAck, MsgBeatAsk, MsgFeedAck, MsgFenced, MsgJoin, MsgJoined}

func FuzzDecodeControl(f *testing.F) {
	for _, m := range allSampleMessages(f) {
		if m.Type() != MsgBlock {
			f.Add(uint8(m.Type()), AppendMessage(nil, m))
		}
	}
	f.Fuzz(func(t *testing.T, typ uint8, payload []byte) {
		// Mostly the control types (a seed's own type as itself); now and
		// then any type at all.
		mt := MsgType(typ)
		if typ < 128 && (!mt.Valid() || mt == MsgBlock) {
			mt = controlTypes[int(typ)%len(controlTypes)]
		}
		m, err := DecodeMessage(mt, payload)
		if err != nil {
			checkClassified(t, err)
			return
		}
		if m.Type() != mt {
			t.Fatalf("decoded %v as %v", mt, m.Type())
		}
		checkMessageRoundTrip(t, m, payload)
	})
}

// checkMessageRoundTrip: m was decoded from payload; encoding it must give
// payload back, and decoding that must give m.
func checkMessageRoundTrip(t *testing.T, m Message, payload []byte) {
	t.Helper()
	again := AppendMessage(nil, m)
	if !bytes.Equal(again, payload) {
		t.Fatalf("%v re-encodes differently:\n%x\n%x", m.Type(), payload, again)
	}
	m2, err := DecodeMessage(m.Type(), again)
	if err != nil || !reflect.DeepEqual(m, m2) {
		t.Fatalf("round trip: %+v became %+v, %v", m, m2, err)
	}
	var generic []any
	if err := msgpack.Unmarshal(payload, &generic); err != nil {
		t.Fatalf("msgpack rejects a message we accept: %v", err)
	}
}

func FuzzScanTuple(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4}, mustTuple(f, []Value{Int64(-129), Float64(0.5), String("héllo"), Bytes([]byte{0, 1, 2})}))
	f.Fuzz(func(t *testing.T, schema, b []byte) {
		types := make([]Type, min(len(schema), 64))
		for i := range types {
			types[i] = Type(schema[i]%4 + 1)
		}
		offs := make([]int, len(types)+1)
		n, err := ScanTuple(b, types, offs)
		vals, dn, derr := DecodeTuple(b, types, nil)
		if (err == nil) != (derr == nil) || n != dn {
			t.Fatalf("ScanTuple = %d, %v but DecodeTuple = %d, %v", n, err, dn, derr)
		}
		if err != nil {
			checkClassified(t, err)
			checkClassified(t, derr)
			return
		}
		if offs[0] < 1 || offs[len(types)] != n {
			t.Fatalf("offsets %v for a tuple of %d bytes", offs, n)
		}
		for i := range types {
			if offs[i+1] <= offs[i] {
				t.Fatalf("offsets %v not increasing", offs)
			}
		}
		if an, err := scanTupleAny(b); err != nil || an != n {
			t.Fatalf("schema-less scan = %d, %v; ScanTuple %d", an, err, n)
		}
		all := make([]int, len(types))
		for i := range all {
			all[i] = i
		}
		if key := AppendKey(nil, b, offs, all); !bytes.Equal(key, b[:n]) {
			t.Fatalf("key of all columns %x differs from tuple %x", key, b[:n])
		}
		if re := mustTuple(t, vals); !bytes.Equal(re, b[:n]) {
			t.Fatalf("tuple re-encodes differently:\n%x\n%x", b[:n], re)
		}
		var generic []any
		if err := msgpack.Unmarshal(b[:n], &generic); err != nil || len(generic) != len(types) {
			t.Fatalf("msgpack reads our tuple as %v, %v", generic, err)
		}
	})
}

// FuzzDecodeValues is DecodeValues on procedure parameters and results.
// Every form it accepts is canonical, so an accepted tuple re-encodes
// (AppendTuple) to exactly its own bytes, b[:n]; what follows them is left
// alone.
func FuzzDecodeValues(f *testing.F) {
	f.Add(mustTuple(f, []Value{String("accounts"), Int64(-40000), Float64(2.5), Bytes([]byte{1, 2})}))
	f.Fuzz(func(t *testing.T, b []byte) {
		vals, n, err := DecodeValues(b, nil)
		if err != nil {
			checkClassified(t, err)
			if n != 0 {
				t.Fatalf("error %v with length %d", err, n)
			}
			if an, aerr := scanTupleAny(b); aerr == nil {
				t.Fatalf("schema-less scan takes %d bytes that DecodeValues refuses: %v", an, err)
			}
			return
		}
		if n < 1 || n > len(b) {
			t.Fatalf("decoded %d of %d bytes", n, len(b))
		}
		if an, err := scanTupleAny(b); err != nil || an != n {
			t.Fatalf("schema-less scan = %d, %v; DecodeValues %d", an, err, n)
		}
		if re := mustTuple(t, vals); !bytes.Equal(re, b[:n]) {
			t.Fatalf("values re-encode differently:\n%x\n%x", b[:n], re)
		}
		types := make([]Type, len(vals))
		for i, v := range vals {
			types[i] = v.Type
		}
		if !reflect.DeepEqual(types, inferTypes(t, b[:n])) {
			t.Fatalf("types %v, type codes say %v", types, inferTypes(t, b[:n]))
		}
		// A reused dst (as partition reuses a row) gives the same values.
		again, n2, err := DecodeValues(b, make([]Value, 3, 5))
		if err != nil || n2 != n || len(again) != len(vals) {
			t.Fatalf("into a used dst: %d values, %d bytes, %v", len(again), n2, err)
		}
		for i := range vals {
			if !again[i].Equal(vals[i]) {
				t.Fatalf("into a used dst, field %d is %v, not %v", i, again[i], vals[i])
			}
		}
		var generic []any
		if err := msgpack.Unmarshal(b[:n], &generic); err != nil || len(generic) != len(vals) {
			t.Fatalf("msgpack reads our values as %v, %v", generic, err)
		}
	})
}

// checkTupleRoundTrip: tup is one whole tuple of types.
func checkTupleRoundTrip(t *testing.T, tup []byte, types []Type) {
	t.Helper()
	vals, n, err := DecodeTuple(tup, types, nil)
	if err != nil || n != len(tup) {
		t.Fatalf("DecodeTuple(%x, %v) = %d, %v", tup, types, n, err)
	}
	if re := mustTuple(t, vals); !bytes.Equal(re, tup) {
		t.Fatalf("tuple re-encodes differently:\n%x\n%x", tup, re)
	}
}

// inferTypes returns the column types a schema-less tuple's type codes
// imply.
func inferTypes(t *testing.T, tup []byte) []Type {
	n, pos, err := ReadArrayHeader(tup)
	if err != nil {
		t.Fatal(err)
	}
	types := make([]Type, n)
	for i := range types {
		switch c := tup[pos]; {
		case c == 0xcb:
			types[i] = TypeFloat64
		case c&0xe0 == 0xa0 || (c >= 0xd9 && c <= 0xdb):
			types[i] = TypeString
		case c >= 0xc4 && c <= 0xc6:
			types[i] = TypeBytes
		default:
			types[i] = TypeInt64
		}
		l, err := scanScalar(tup[pos:])
		if err != nil {
			t.Fatal(err)
		}
		pos += l
	}
	return types
}

// TestWriteFuzzSeeds writes the seed corpus: real encoded frames and
// messages, and truncated and corrupt ones. It runs only with
// -write-seeds; crashers the fuzzer finds are added beside these.
func TestWriteFuzzSeeds(t *testing.T) {
	if !*writeSeeds {
		t.Skip("run with -write-seeds to rewrite testdata/fuzz")
	}
	write := func(target, name string, args ...any) {
		var b bytes.Buffer
		b.WriteString("go test fuzz v1\n")
		for _, a := range args {
			switch a := a.(type) {
			case []byte:
				fmt.Fprintf(&b, "[]byte(%q)\n", a)
			case bool:
				fmt.Fprintf(&b, "bool(%v)\n", a)
			case uint8:
				fmt.Fprintf(&b, "byte(%q)\n", rune(a))
			default:
				t.Fatalf("seed arg %T", a)
			}
		}
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "seed-"+name), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The cluster messages come after the first rejoin messages and the
	// block, and the rejoin messages numbered after them (Hold,
	// HandoffAck) last, so every seed keeps its name.
	msgs := append(sampleMessages(t), compressibleBlock(t))
	msgs = append(msgs, sampleClusterMessages(t)...)
	msgs = append(msgs, lateRejoinMessages()...)
	msgs = append(msgs, lateClusterMessages()...)
	for _, c := range allCodecs {
		for i, m := range msgs {
			fr := mustFrame(t, m, c)
			name := fmt.Sprintf("%s-%d-%v", m.Type(), i, c)
			write("FuzzDecodeFrame", name, fr, false)
			write("FuzzDecodeFrame", name+"-cut", fr[:len(fr)*2/3], false)
			write("FuzzDecodeFrame", name+"-flip", patch(fr, len(fr)-1, fr[len(fr)-1]^0x10), false)
			write("FuzzDecodeFrame", name+"-flip-resealed", patch(fr, len(fr)-1, fr[len(fr)-1]^0x10), true)
		}
	}
	fr := mustFrame(t, msgs[0], CodecNone)
	write("FuzzDecodeFrame", "huge-length", patch(fr, 0, 0x7f), false)
	write("FuzzDecodeFrame", "unknown-type", patch(fr, frameTypeAt, 0x42), true)
	write("FuzzDecodeFrame", "unknown-codec", patch(fr, frameCodecAt, 0x42), true)
	write("FuzzDecodeFrame", "two-frames", append(bytes.Clone(fr), fr...), false)

	for i, m := range []*Block{msgs[2].(*Block), compressibleBlock(t), randomBlock(t, 3), {Kind: BlockDeletes, Seq: 1}} {
		p := AppendMessage(nil, m)
		write("FuzzDecodeBlock", fmt.Sprintf("block-%d", i), p)
		write("FuzzDecodeBlock", fmt.Sprintf("block-%d-cut", i), p[:len(p)-1])
		write("FuzzDecodeBlock", fmt.Sprintf("block-%d-trailing", i), append(p, 0x90))
	}
	write("FuzzDecodeBlock", "noncanonical-int", []byte{0x96, 5, 6, 1, 1, 1, 0x91, 0x91, 0xd3, 0, 0, 0, 0, 0, 0, 0, 1})
	write("FuzzDecodeBlock", "huge-count", []byte{0x96, 5, 6, 1, 1, 1, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90})

	for _, m := range msgs {
		if m.Type() == MsgBlock || !m.Type().Rejoin() {
			continue
		}
		p := AppendMessage(nil, m)
		name := m.Type().String()
		write("FuzzDecodeControl", name, uint8(m.Type()), p)
		write("FuzzDecodeControl", name+"-cut", uint8(m.Type()), p[:len(p)-1])
		write("FuzzDecodeControl", name+"-wrong-type", uint8(m.Type()%6+1), p)
	}
	// Several samples share a type; name the cluster seeds by index too.
	for i, m := range sampleClusterMessages(t) {
		p := AppendMessage(nil, m)
		name := fmt.Sprintf("%s-%d", m.Type(), i)
		write("FuzzDecodeControl", name, uint8(m.Type()), p)
		write("FuzzDecodeControl", name+"-cut", uint8(m.Type()), p[:len(p)-1])
		write("FuzzDecodeControl", name+"-wrong-type", uint8((m.Type()-MsgHello+1)%(MsgRepairEnd-MsgHello+1)+MsgHello), p)
	}
	for _, m := range lateClusterMessages() {
		p := AppendMessage(nil, m)
		name := m.Type().String()
		write("FuzzDecodeControl", name, uint8(m.Type()), p)
		write("FuzzDecodeControl", name+"-cut", uint8(m.Type()), p[:len(p)-1])
		write("FuzzDecodeControl", name+"-wrong-type", uint8(MsgDone), p)
	}
	write("FuzzDecodeControl", "hello-kind-0", uint8(MsgHello), []byte{0x95, 0, 0xa2, 'n', '1', 1, 2, 3})
	write("FuzzDecodeControl", "call-each-nil", uint8(MsgCall), []byte{0x95, 1, 2, 0xa1, 'p', 0xc4, 1, 0x90, 0xc0})
	write("FuzzDecodeControl", "reply-each-huge", uint8(MsgReply), []byte{0x95, 1, 2, 0xc4, 0, 0xa0, 0xdd, 0xff, 0xff, 0xff, 0xff})
	write("FuzzDecodeControl", "repair-initiator-over", uint8(MsgRepair), []byte{0x93, 3, 0xce, 0, 1, 0, 0, 5})
	write("FuzzDecodeControl", "repair-end-err-bin", uint8(MsgRepairEnd), []byte{0x94, 3, 1, 5, 0xc4, 1, 'x'})
	write("FuzzDecodeControl", "abort-noncanonical-text", uint8(MsgAbort), []byte{0x94, 5, 6, 1, 0xd9, 3, 'a', 'b', 'c'})

	for i, vals := range [][]Value{
		{Int64(-129), Float64(0.5), String("héllo"), Bytes([]byte{0, 1, 2})},
		{Int64(1 << 40), String(string(make([]byte, 300))), Bytes(make([]byte, 300))},
		{Bytes(make([]byte, 16)), Bytes(make([]byte, 100))},
		{},
	} {
		schema := make([]byte, len(vals))
		for j, v := range vals {
			schema[j] = byte(v.Type - 1)
		}
		tup := mustTuple(t, vals)
		write("FuzzScanTuple", fmt.Sprintf("tuple-%d", i), schema, tup)
		write("FuzzScanTuple", fmt.Sprintf("tuple-%d-cut", i), schema, tup[:len(tup)/2])
	}
	write("FuzzScanTuple", "noncanonical", []byte{0}, []byte{0x91, 0xcc, 0x05})

	for i, vals := range [][]Value{
		{String("accounts"), Int64(-40000), Float64(2.5), Bytes([]byte{1, 2}), Int64(1 << 40), String("")},
		{Int64(math.MinInt64), Int64(math.MaxInt64), Float64(math.NaN()), Bytes([]byte{})},
		{String(string(make([]byte, 40))), Bytes(make([]byte, 300)), Int64(-33), Int64(128)},
		make([]Value, 20),
		{},
	} {
		for j := range vals {
			if vals[j].Type == 0 {
				vals[j] = Int64(int64(j))
			}
		}
		tup := mustTuple(t, vals)
		write("FuzzDecodeValues", fmt.Sprintf("values-%d", i), tup)
		write("FuzzDecodeValues", fmt.Sprintf("values-%d-cut", i), tup[:len(tup)/2])
		write("FuzzDecodeValues", fmt.Sprintf("values-%d-trailing", i), append(tup, 0xc0))
	}
	write("FuzzDecodeValues", "nil-field", []byte{0x91, 0xc0})
	write("FuzzDecodeValues", "float32", []byte{0x91, 0xca, 0, 0, 0, 0})
	write("FuzzDecodeValues", "nested-array", []byte{0x92, 1, 0x91, 2})
	write("FuzzDecodeValues", "map", []byte{0x81, 1, 2})
	write("FuzzDecodeValues", "noncanonical-int", []byte{0x91, 0xcd, 0, 5})
	write("FuzzDecodeValues", "noncanonical-str", []byte{0x91, 0xd9, 1, 'x'})
	write("FuzzDecodeValues", "noncanonical-array16", []byte{0xdc, 0, 1, 7})
	write("FuzzDecodeValues", "uint64-overflow", []byte{0x91, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0})
	write("FuzzDecodeValues", "fields-over-limit", append([]byte{0xdc, 0x10, 0x01}, make([]byte, TupleFieldsMax+1)...))
	write("FuzzDecodeValues", "huge-array32", []byte{0xdd, 0xff, 0xff, 0xff, 0xff})
}
