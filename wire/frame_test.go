package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/klauspost/compress/s2"
)

var allCodecs = []Codec{CodecNone, CodecS2, CodecZstd}

func mustFrame(t testing.TB, m Message, c Codec) []byte {
	t.Helper()
	f, err := AppendFrame(nil, m, c)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// reseal recomputes the checksum of a frame whose header or payload a test
// changed on purpose, so the change reaches the checks behind it.
func reseal(f []byte) []byte {
	binary.BigEndian.PutUint32(f[frameSumAt:], frameChecksum(f, f[FrameHeaderBytes:]))
	return f
}

func TestFrameRoundTrip(t *testing.T) {
	msgs := append(allSampleMessages(t), compressibleBlock(t))
	for _, c := range allCodecs {
		var stream []byte
		var enc FrameEncoder
		for _, m := range msgs {
			var err error
			if stream, err = enc.AppendFrame(stream, m, c); err != nil {
				t.Fatal(err)
			}
		}
		// Frames decode one after another from one buffer.
		var dec FrameDecoder
		rest := stream
		for _, want := range msgs {
			got, n, err := dec.DecodeFrame(rest)
			if err != nil {
				t.Fatalf("codec=%v %v: %v", c, want.Type(), err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("codec=%v: got %+v, want %+v", c, got, want)
			}
			rest = rest[n:]
		}
		if len(rest) != 0 {
			t.Fatalf("codec=%v: %d bytes left", c, len(rest))
		}
	}
}

func TestFrameCodecChoice(t *testing.T) {
	big := compressibleBlock(t)
	for _, tt := range []struct {
		m    Message
		ask  Codec
		want Codec
	}{
		{big, CodecNone, CodecNone},
		{big, CodecS2, CodecS2},
		{big, CodecZstd, CodecZstd},
		// Too short to be worth it.
		{&Ack{Seq: 1}, CodecS2, CodecNone},
		{&Ack{Seq: 1}, CodecZstd, CodecNone},
		// Incompressible.
		{randomBlock(t, 100), CodecS2, CodecNone},
		{randomBlock(t, 100), CodecZstd, CodecNone},
	} {
		f := mustFrame(t, tt.m, tt.ask)
		h, err := ParseFrameHeader(f)
		if err != nil {
			t.Fatal(err)
		}
		if h.Codec != tt.want {
			t.Errorf("%v asking %v: frame says %v", tt.m.Type(), tt.ask, h.Codec)
		}
		if h.Codec != CodecNone && h.PayloadBytes >= h.RawBytes {
			t.Errorf("compressed payload of %d bytes for %d raw", h.PayloadBytes, h.RawBytes)
		}
	}
}

// randomBlock returns a block of n rows of random bytes, which no codec
// can shrink.
func randomBlock(t testing.TB, n int) *Block {
	rng := rand.New(rand.NewPCG(1, 2))
	var e TupleEncoder
	tuples := AppendArrayHeader(nil, n)
	for range n {
		v := make([]byte, 64)
		for i := range v {
			v[i] = byte(rng.Uint32())
		}
		tuples, _ = e.AppendTuple(tuples, []Value{Bytes(v)})
	}
	return &Block{Kind: BlockSnapshot, Count: uint32(n), Tuples: tuples}
}

func TestBlockWriterMatchesAppendFrame(t *testing.T) {
	h := MsgHeader{Epoch: 1 << 40, Partition: 1 << 20}
	var w BlockWriter
	var e TupleEncoder
	// Counts cross the fixarray/array16/array32 boundaries of the header.
	for _, n := range []int{0, 1, 15, 16, 65535, 65536} {
		w.Reset(h, BlockDeletes, 70000, uint64(n)+1)
		stored := AppendArrayHeader(nil, n)
		for i := range n {
			row := []Value{Int64(int64(i))}
			if i%2 == 0 {
				if err := w.AppendTuple(row); err != nil {
					t.Fatal(err)
				}
			} else {
				tup, _ := e.AppendTuple(nil, row)
				w.AppendStored(tup)
			}
			stored, _ = e.AppendTuple(stored, row)
		}
		if w.Count() != n || w.TupleBytes() != len(stored)-len(AppendArrayHeader(nil, n)) {
			t.Fatalf("n=%d: Count %d TupleBytes %d", n, w.Count(), w.TupleBytes())
		}
		want := &Block{MsgHeader: h, Kind: BlockDeletes, Table: 70000, Seq: uint64(n) + 1, Count: uint32(n), Tuples: stored}
		if n == 0 {
			want.Tuples = []byte{0x90}
		}
		if got := w.Block(); !reflect.DeepEqual(got, want) {
			t.Fatalf("n=%d: Block() = %+v", n, got)
		}
		for _, c := range allCodecs {
			got, err := w.Frame(c)
			if err != nil {
				t.Fatal(err)
			}
			if c == CodecZstd {
				m, _, err := DecodeFrame(got)
				if err != nil || !reflect.DeepEqual(m, want) {
					t.Fatalf("n=%d codec=%v: decodes to %v, %v", n, c, m, err)
				}
				continue
			}
			if exp := mustFrame(t, want, c); !bytes.Equal(got, exp) {
				t.Fatalf("n=%d codec=%v: BlockWriter frame differs from AppendFrame", n, c)
			}
		}
	}
}

func TestBlockWriterMisuse(t *testing.T) {
	var w BlockWriter
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Frame before Reset did not panic")
			}
		}()
		_, _ = w.Frame(CodecNone)
	}()
	w.Reset(MsgHeader{}, BlockSnapshot, 1, 1)
	if err := w.AppendTuple([]Value{{Type: 99}}); !errors.Is(err, ErrMalformed) || w.Count() != 0 || w.TupleBytes() != 0 {
		t.Fatalf("bad tuple: %v, count %d", err, w.Count())
	}
	if _, err := w.Frame(Codec(7)); !errors.Is(err, ErrUnknownCodec) {
		t.Fatalf("unknown codec: %v", err)
	}
}

func TestFrameTooLarge(t *testing.T) {
	val := bytes.Repeat([]byte{'x'}, 1<<16)
	var w BlockWriter
	w.Reset(MsgHeader{}, BlockSnapshot, 1, 1)
	for w.TupleBytes() <= FramePayloadRawBytesMax {
		if err := w.AppendTuple([]Value{Bytes(val)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range allCodecs {
		if _, err := w.Frame(c); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("BlockWriter.Frame codec=%v: %v, want ErrTooLarge", c, err)
		}
		dst := []byte("keep")
		out, err := AppendFrame(dst, w.Block(), c)
		if !errors.Is(err, ErrTooLarge) || string(out) != "keep" {
			t.Fatalf("AppendFrame codec=%v: %q, %v; want dst unchanged, ErrTooLarge", c, out[:min(len(out), 8)], err)
		}
	}
	if _, err := AppendFrame(nil, &Ack{}, Codec(3)); !errors.Is(err, ErrUnknownCodec) {
		t.Fatalf("unknown codec: %v", err)
	}
}

// Every proper prefix of a frame is ErrTruncated and nothing else, so a
// reader can always tell "read more" from "give up".
func TestFramePrefixesTruncated(t *testing.T) {
	for _, c := range allCodecs {
		for _, m := range append(allSampleMessages(t), compressibleBlock(t)) {
			f := mustFrame(t, m, c)
			for cut := range len(f) {
				if _, n, err := DecodeFrame(f[:cut]); !errors.Is(err, ErrTruncated) || n != 0 {
					t.Fatalf("codec=%v %v cut at %d of %d: %d, %v; want ErrTruncated", c, m.Type(), cut, len(f), n, err)
				}
			}
		}
	}
}

// No single flipped bit goes unnoticed; in the payload or the checksum it
// is always ErrChecksum.
func TestFrameBitFlips(t *testing.T) {
	classes := []error{ErrTruncated, ErrTooLarge, ErrUnknownType, ErrUnknownCodec, ErrMalformed, ErrChecksum}
	for _, c := range allCodecs {
		for _, m := range []Message{sampleMessages(t)[0], compressibleBlock(t)} {
			f := mustFrame(t, m, c)
			for i := range len(f) * 8 {
				g := bytes.Clone(f)
				g[i/8] ^= 1 << (i % 8)
				_, _, err := DecodeFrame(g)
				if err == nil {
					t.Fatalf("codec=%v %v: flip of bit %d not detected", c, m.Type(), i)
				}
				if i/8 >= frameSumAt && !errors.Is(err, ErrChecksum) {
					t.Fatalf("codec=%v %v: flip of bit %d: %v, want ErrChecksum", c, m.Type(), i, err)
				}
				if !slicesAny(classes, func(e error) bool { return errors.Is(err, e) }) {
					t.Fatalf("flip of bit %d: unclassified error %v", i, err)
				}
			}
		}
	}
}

func slicesAny(errs []error, f func(error) bool) bool {
	for _, e := range errs {
		if f(e) {
			return true
		}
	}
	return false
}

func TestFrameErrors(t *testing.T) {
	ack := mustFrame(t, &Ack{Seq: 1}, CodecNone)
	block := compressibleBlock(t)
	s2f := mustFrame(t, block, CodecS2)
	zf := mustFrame(t, block, CodecZstd)
	raw := AppendMessage(nil, block)
	put32 := func(f []byte, at int, v uint32) []byte {
		g := bytes.Clone(f)
		binary.BigEndian.PutUint32(g[at:], v)
		return g
	}
	// frameOf builds a frame around any payload, with a correct checksum.
	frameOf := func(t MsgType, c Codec, rawLen int, payload []byte) []byte {
		f := append(make([]byte, FrameHeaderBytes), payload...)
		sealFrame(f, t, c, rawLen)
		return f
	}
	tests := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"empty", nil, ErrTruncated},
		{"header only", ack[:FrameHeaderBytes], ErrTruncated},
		{"payload over limit", put32(ack, framePayloadLenAt, FrameBytesMax+1), ErrTooLarge},
		{"payload length 4 GiB", put32(ack, framePayloadLenAt, 0xffffffff), ErrTooLarge},
		{"raw over limit", put32(s2f, frameRawLenAt, FramePayloadRawBytesMax+1), ErrTooLarge},
		{"type 0", patch(ack, frameTypeAt, 0), ErrUnknownType},
		{"type 23", patch(ack, frameTypeAt, 23), ErrUnknownType},
		{"codec 3", patch(ack, frameCodecAt, 3), ErrUnknownCodec},
		{"codec 255", patch(ack, frameCodecAt, 255), ErrUnknownCodec},
		{"uncompressed with other raw length", put32(ack, frameRawLenAt, 99), ErrMalformed},
		{"checksum", put32(ack, frameSumAt, 0), ErrChecksum},
		{"type changed, header not resealed", patch(ack, frameTypeAt, byte(MsgHeartbeat)), ErrChecksum},
		{"payload changed", patch(ack, FrameHeaderBytes+3, 8), ErrChecksum},
		{"empty payload", frameOf(MsgAck, CodecNone, 0, nil), ErrMalformed},
		{"message cut short in whole frame", frameOf(MsgAck, CodecNone, 3, []byte{0x93, 1, 2}), ErrMalformed},
		{"message non-canonical", frameOf(MsgAck, CodecNone, 5, []byte{0x93, 1, 2, 0xcc, 3}), ErrNonCanonical},
		{"message of another type", frameOf(MsgPropose, CodecNone, len(raw), raw), ErrMalformed},
		{"s2 raw length too small", reseal(put32(s2f, frameRawLenAt, uint32(len(raw)-1))), ErrCodec},
		{"s2 raw length too large", reseal(put32(s2f, frameRawLenAt, uint32(len(raw)+1))), ErrCodec},
		{"s2 garbage", frameOf(MsgBlock, CodecS2, 10, []byte{10, 0xff, 0xff, 0xff}), ErrCodec},
		{"s2 bad varint", frameOf(MsgBlock, CodecS2, 10, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), ErrCodec},
		{"s2 empty", frameOf(MsgBlock, CodecS2, 10, nil), ErrCodec},
		{"zstd raw length too small", reseal(put32(zf, frameRawLenAt, uint32(len(raw)-1))), ErrCodec},
		{"zstd raw length too large", reseal(put32(zf, frameRawLenAt, uint32(len(raw)+1))), ErrCodec},
		{"zstd garbage", frameOf(MsgBlock, CodecZstd, 10, []byte("not zstd at all")), ErrCodec},
		{"zstd empty", frameOf(MsgBlock, CodecZstd, 10, nil), ErrCodec},
		{"zstd two frames", frameOf(MsgBlock, CodecZstd, len(raw), append(bytes.Clone(zf[FrameHeaderBytes:]), zf[FrameHeaderBytes:]...)), ErrCodec},
		{"s2 of a bad message", frameOf(MsgBlock, CodecS2, 3, s2.Encode(nil, []byte{0x93, 1, 2})), ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, n, err := DecodeFrame(tt.frame)
			if !errors.Is(err, tt.want) || m != nil || n != 0 {
				t.Fatalf("DecodeFrame = %v, %d, %v; want %v", m, n, err, tt.want)
			}
			if tt.want != ErrTruncated && errors.Is(err, ErrTruncated) {
				t.Fatalf("whole frame reported as truncated: %v", err)
			}
			if !strings.HasPrefix(err.Error(), "wire: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestDecodePayload(t *testing.T) {
	f := mustFrame(t, compressibleBlock(t), CodecS2)
	h, err := ParseFrameHeader(f)
	if err != nil {
		t.Fatal(err)
	}
	if h.FrameBytes() != len(f) {
		t.Fatalf("FrameBytes %d, frame %d", h.FrameBytes(), len(f))
	}
	var d FrameDecoder
	if _, err := d.DecodePayload(h, f[FrameHeaderBytes:len(f)-1]); !errors.Is(err, ErrTruncated) {
		t.Fatalf("short payload: %v", err)
	}
	m, err := d.DecodePayload(h, bytes.Clone(f[FrameHeaderBytes:]))
	if err != nil || !reflect.DeepEqual(m, compressibleBlock(t)) {
		t.Fatalf("DecodePayload = %v, %v", m, err)
	}
}

// Decoding allocates the message and nothing per tuple; a FrameDecoder
// reuses its buffer for compressed frames.
func TestDecodeFrameAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not stable under -race")
	}
	for _, c := range allCodecs {
		f := mustFrame(t, compressibleBlock(t), c)
		var d FrameDecoder
		if _, _, err := d.DecodeFrame(f); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(20, func() {
			if _, _, err := d.DecodeFrame(f); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 1 {
			t.Errorf("codec=%v: %v allocations per DecodeFrame, want 1", c, allocs)
		}
	}
}

// BlockWriter reuses its buffers: a steady stream of blocks allocates
// nothing.
func TestBlockWriterAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not stable under -race")
	}
	tuples := sampleTuples(t, 40)
	_, hdr, _ := ReadArrayHeader(tuples)
	var rows [][]byte
	for pos := hdr; pos < len(tuples); {
		n, err := ScanTuple(tuples[pos:], sampleTypes, nil)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, tuples[pos:pos+n])
		pos += n
	}
	for _, c := range allCodecs {
		var w BlockWriter
		run := func() {
			w.Reset(MsgHeader{Epoch: 1}, BlockSnapshot, 1, 1)
			for _, r := range rows {
				w.AppendStored(r)
			}
			if _, err := w.Frame(c); err != nil {
				t.Fatal(err)
			}
		}
		run()
		if allocs := testing.AllocsPerRun(20, run); allocs > 0 {
			t.Errorf("codec=%v: %v allocations per block", c, allocs)
		}
	}
}
