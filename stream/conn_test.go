package stream

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/wire"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair returns two Conns joined over a loopback TCP connection.
func pair(t *testing.T, cfg Config) (client, server *Conn) {
	t.Helper()
	ln, err := Listen("")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- nc
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client, err = Dial(ctx, ln.Addr().String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	nc := <-accepted
	if nc == nil {
		t.Fatal("accept failed")
	}
	server = NewConn(nc, cfg)
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

func sampleMessages() []wire.Message {
	h := wire.MsgHeader{Epoch: 9, Partition: 2}
	tuples := wire.AppendArrayHeader(nil, 300)
	enc := wire.TupleEncoder{}
	for i := 0; i < 300; i++ {
		tuples, _ = enc.AppendTuple(tuples, []wire.Value{wire.Int64(int64(i)), wire.String("some repeated text, some repeated text")})
	}
	return []wire.Message{
		&wire.Propose{MsgHeader: h, TxnID: 11},
		&wire.Answer{MsgHeader: h, TxnID: 12},
		&wire.Block{MsgHeader: h, Kind: wire.BlockSnapshot, Table: 1, Seq: 1, Count: 300, Tuples: tuples},
		&wire.Ack{MsgHeader: h, Seq: 1},
		&wire.Handoff{MsgHeader: h, TxnID: 20, Digest: 0xfeed, LastSeq: 1, Rows: 300},
		&wire.Abort{MsgHeader: h, Reason: wire.AbortTimeout, Text: "no progress"},
		&wire.Heartbeat{MsgHeader: h, Tick: 3},
	}
}

func TestRoundTripEveryMessageAndCodec(t *testing.T) {
	for _, codec := range []wire.Codec{wire.CodecNone, wire.CodecS2, wire.CodecZstd} {
		client, server := pair(t, Config{Codec: codec, StallWindow: 5 * time.Second})
		msgs := sampleMessages()
		errc := make(chan error, 1)
		go func() {
			for _, m := range msgs {
				if err := client.Send(context.Background(), m); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for _, want := range msgs {
			got, err := server.Recv()
			if err != nil {
				t.Fatalf("codec %v: recv: %v", codec, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("codec %v: got %#v, want %#v", codec, got, want)
			}
		}
		if err := <-errc; err != nil {
			t.Fatalf("codec %v: send: %v", codec, err)
		}
	}
}

func TestStallWindow(t *testing.T) {
	_, server := pair(t, Config{StallWindow: 100 * time.Millisecond})
	_, err := server.Recv()
	if !errors.Is(err, ErrStalled) {
		t.Fatalf("recv on a silent link: %v, want ErrStalled", err)
	}
}

func TestCloseUnblocksRecv(t *testing.T) {
	_, server := pair(t, Config{})
	errc := make(chan error, 1)
	go func() {
		_, err := server.Recv()
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	server.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("recv after close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv still blocked 5 s after Close")
	}
}

func TestPeerGoneAndCorruptFrame(t *testing.T) {
	client, server := pair(t, Config{StallWindow: 5 * time.Second})
	frame, err := wire.AppendFrame(nil, &wire.Ack{MsgHeader: wire.MsgHeader{Epoch: 1}, Seq: 5}, wire.CodecNone)
	if err != nil {
		t.Fatal(err)
	}
	frame[len(frame)-1] ^= 0xff
	if _, err := client.nc.Write(frame); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Recv(); !errors.Is(err, wire.ErrChecksum) {
		t.Fatalf("corrupt frame: %v, want wire.ErrChecksum", err)
	}
	client.Close()
	_, err = server.Recv()
	if !errors.Is(err, io.EOF) || errors.Is(err, ErrStalled) || errors.Is(err, ErrClosed) {
		t.Fatalf("peer closed: %v, want an EOF link error", err)
	}
}

func TestLimiterPacesToRate(t *testing.T) {
	now := time.Unix(0, 0)
	l := testLimiter{newLimiter(1000), &now} // 1000 B/s, burst 100 B
	if d, _ := l.reserve(100); d != 0 {
		t.Fatalf("first 100 B within the burst waited %v", d)
	}
	if d, _ := l.reserve(500); d != 500*time.Millisecond {
		t.Fatalf("500 B past an empty bucket: wait %v, want 500ms", d)
	}
	now = now.Add(500 * time.Millisecond) // the debt is paid
	if d, _ := l.reserve(100); d != 100*time.Millisecond {
		t.Fatalf("100 B on an empty bucket: wait %v, want 100ms", d)
	}
	now = now.Add(10 * time.Second) // idle: credit caps at the burst
	if d, _ := l.reserve(200); d != 100*time.Millisecond {
		t.Fatalf("200 B after a long idle: wait %v, want 100ms (burst is 100 B)", d)
	}
}

func TestRateLimitedSendHonoursContext(t *testing.T) {
	client, _ := pair(t, Config{RateBytesPerSec: 1000})
	big := sampleMessages()[2] // ~12 KB: 12 s at 1000 B/s
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := client.Send(ctx, big); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send past its deadline: %v, want context.DeadlineExceeded", err)
	}
}

// TestWriteFrameFlushesBeforeRateWait: frames written without a flush
// go out before a later frame waits for the rate limit, not after it.
func TestWriteFrameFlushesBeforeRateWait(t *testing.T) {
	client, server := pair(t, Config{RateBytesPerSec: 1000, StallWindow: 5 * time.Second})
	var enc wire.FrameEncoder
	small, err := enc.AppendFrame(nil, &wire.Ack{Seq: 1}, wire.CodecNone)
	if err != nil {
		t.Fatal(err)
	}
	big, err := enc.AppendFrame(nil, sampleMessages()[2], wire.CodecNone) // ~12 KB: 12 s at 1000 B/s
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.WriteFrame(ctx, small); err != nil { // within the burst: no wait, no flush
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- client.WriteFrame(ctx, big) }() // waits for the rate limit
	start := time.Now()
	m, err := server.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ack, ok := m.(*wire.Ack); !ok || ack.Seq != 1 {
		t.Fatalf("got %v, want the ack", m)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the written frame arrived after %s", took)
	}
	client.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("the waiting write: %v, want ErrClosed", err)
	}
}

// A frame whose wait ends early (its context, the connection closed) is
// not written, and gives its bytes back: the next frame does not wait for
// them.
func TestLimiterCancelGivesBack(t *testing.T) {
	now := time.Unix(0, 0)
	l := testLimiter{newLimiter(1000), &now} // 1000 B/s, burst 100 B
	if d, _ := l.reserve(100); d != 0 {
		t.Fatalf("first 100 B within the burst waited %v", d)
	}
	d, cancel := l.reserve(1000)
	if d != time.Second {
		t.Fatalf("1000 B past an empty bucket: wait %v, want 1s", d)
	}
	cancel()
	if d, _ := l.reserve(100); d != 100*time.Millisecond {
		t.Fatalf("100 B after a cancelled 1000: wait %v, want 100ms", d)
	}
}

// testLimiter reserves on a limiter at a clock the test moves.
type testLimiter struct {
	lim *rate.Limiter
	now *time.Time
}

// reserve takes n bytes and returns how long to wait before writing them,
// and a cancel that gives them back.
func (l testLimiter) reserve(n int) (time.Duration, func()) {
	d, rs := reserveBytes(l.lim, *l.now, n)
	return d, func() { cancelBytes(rs, *l.now) }
}

// TestRecvAllocatesAsBytesArrive (issue 24, 5): a frame header that
// announces 8 MiB, followed by a few bytes, costs the reader what
// arrived, not what was announced: a dialler cannot make a node allocate
// 8 MiB per connection with 16 bytes.
func TestRecvAllocatesAsBytesArrive(t *testing.T) {
	const allocMax = 1 << 20
	a, b := net.Pipe()
	defer a.Close()
	server := NewConn(b, Config{})
	defer server.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := server.Recv()
		errc <- err
	}()
	var head [wire.FrameHeaderBytes]byte
	binary.BigEndian.PutUint32(head[0:], wire.FrameBytesMax)
	head[4], head[5] = byte(wire.MsgTxn), byte(wire.CodecNone)
	binary.BigEndian.PutUint32(head[6:], wire.FrameBytesMax)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := a.Write(append(head[:], 0x94, 0x01)); err != nil {
		t.Fatal(err)
	}
	// A pipe's Write returns once read: this one, once Recv has parsed
	// the header and read the first two bytes of the payload.
	if _, err := a.Write([]byte{0x02}); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	a.Close()
	if err := <-errc; !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("recv of a frame cut short: %v, want io.ErrUnexpectedEOF", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > allocMax {
		t.Fatalf("%d bytes allocated for a frame announcing %d of which 3 arrived, want at most %d", got, wire.FrameBytesMax, allocMax)
	}
	t.Logf("%d bytes allocated for a frame announcing %d of which 3 arrived", after.TotalAlloc-before.TotalAlloc, wire.FrameBytesMax)
}

// TestRecvLargeFrameAndFrameBytesMax: a frame of the largest size still
// arrives whole, read as it comes; with SetFrameBytesMax a frame over the
// bound is refused with wire.ErrTooLarge before its payload is read.
func TestRecvLargeFrameAndFrameBytesMax(t *testing.T) {
	client, server := pair(t, Config{Codec: wire.CodecNone, StallWindow: 10 * time.Second})
	tuples := wire.AppendArrayHeader(nil, 1)
	tuples, err := wire.NewTupleEncoder().AppendTuple(tuples, []wire.Value{wire.Bytes(make([]byte, wire.FrameBytesMax-64))})
	if err != nil {
		t.Fatal(err)
	}
	big := &wire.Block{Kind: wire.BlockSnapshot, Table: 1, Seq: 1, Count: 1, Tuples: tuples}
	small := &wire.Ack{Seq: 7}
	errc := make(chan error, 1)
	go func() {
		for _, m := range []wire.Message{big, small, big} {
			if err := client.Send(context.Background(), m); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	got, err := server.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if blk, ok := got.(*wire.Block); !ok || len(blk.Tuples) != len(tuples) {
		t.Fatalf("got %T, want the whole block", got)
	}
	server.SetFrameBytesMax(1 << 10)
	if got, err := server.Recv(); err != nil || !reflect.DeepEqual(got, small) {
		t.Fatalf("a small frame under the bound: %v, %v", got, err)
	}
	if _, err := server.Recv(); !errors.Is(err, wire.ErrTooLarge) {
		t.Fatalf("a frame over SetFrameBytesMax: %v, want wire.ErrTooLarge", err)
	}
	server.Close()
	<-errc // the sender's error, if any: the server closed mid-frame
}
