package node

import (
	"bytes"
	"context"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// writeCounter counts the writes on a connection.
type writeCounter struct {
	net.Conn
	writes atomic.Int64
}

func (w *writeCounter) Write(p []byte) (int, error) {
	w.writes.Add(1)
	return w.Conn.Write(p)
}

// TestLinkBatchesQueuedFrames: small frames queued behind one another
// leave in one write (one syscall, one TLS record), and a frame alone is
// written at once, not held for a later one.
func TestLinkBatchesQueuedFrames(t *testing.T) {
	a, b := net.Pipe()
	counted := &writeCounter{Conn: a}
	sender := stream.NewConn(counted, stream.Config{Codec: wire.CodecNone})
	receiver := stream.NewConn(b, stream.Config{Codec: wire.CodecNone, StallWindow: 10 * time.Second})
	defer receiver.Close()
	l := newLink(wire.CodecNone)
	defer l.close()
	const queued = 20
	var msgs []wire.Message
	for i := range queued {
		msgs = append(msgs, &wire.Ack{MsgHeader: wire.MsgHeader{Epoch: 1, Partition: 2}, Seq: uint64(i + 1)})
	}
	if err := l.queue(msgs); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l.attach(sender)
	l.run(ctx, sender, func(context.Context) {})
	for i := range queued {
		m, err := receiver.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ack, ok := m.(*wire.Ack); !ok || ack.Seq != uint64(i+1) {
			t.Fatalf("frame %d: %v", i, m)
		}
	}
	if w := counted.writes.Load(); w != 1 {
		t.Fatalf("%d queued frames left in %d writes, want 1", queued, w)
	}
	// A lone frame: nothing queued behind it, it must not wait.
	if err := l.queue([]wire.Message{&wire.Ack{MsgHeader: wire.MsgHeader{Epoch: 1, Partition: 2}, Seq: 99}}); err != nil {
		t.Fatal(err)
	}
	m, err := receiver.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ack, ok := m.(*wire.Ack); !ok || ack.Seq != 99 {
		t.Fatalf("lone frame: %v", m)
	}
	l.drain(5 * time.Second)
	if n := l.unsent.Load(); n != 0 {
		t.Fatalf("%d frames unsent after drain", n)
	}
}

// TestLinkReusesFrameBuffers: a link encodes each frame into a buffer
// its writer has written before, so a stream of blocks allocates no
// frame per block, and a reused buffer carries each block intact.
// pipeLink returns a link whose writer runs on one end of a pipe, and the
// other end's connection; both end with the test, or after d.
func pipeLink(t *testing.T, d time.Duration) (l *link, sender, receiver *stream.Conn) {
	t.Helper()
	a, b := net.Pipe()
	sender = stream.NewConn(a, stream.Config{Codec: wire.CodecNone})
	receiver = stream.NewConn(b, stream.Config{Codec: wire.CodecNone, StallWindow: 10 * time.Second})
	l = newLink(wire.CodecNone)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(func() {
		cancel()
		l.close()
		receiver.Close()
	})
	l.attach(sender)
	l.run(ctx, sender, func(context.Context) {})
	return l, sender, receiver
}

func TestLinkReusesFrameBuffers(t *testing.T) {
	l, _, receiver := pipeLink(t, 10*time.Second)
	// Two blocks that differ in their tuples, sent in turn.
	block := benchBlock()
	other := *block
	other.Tuples = bytes.Clone(block.Tuples)
	other.Tuples[len(other.Tuples)-1]++
	send := func(seq uint64) {
		t.Helper()
		m := *block
		if seq%2 == 0 {
			m = other
		}
		m.Seq = seq
		if err := l.queue([]wire.Message{&m}); err != nil {
			t.Fatal(err)
		}
		got, err := receiver.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if gb, ok := got.(*wire.Block); !ok || gb.Seq != seq || !bytes.Equal(gb.Tuples, m.Tuples) {
			t.Fatalf("block %d arrived as %v", seq, got.Type())
		}
		l.drain(5 * time.Second) // the writer is done with the frame
		if n := l.unsent.Load(); n != 0 {
			t.Fatalf("block %d: %d frames unsent after drain", seq, n)
		}
	}
	send(1) // the first frame has no buffer to reuse
	const blocks = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for seq := uint64(2); seq < 2+blocks; seq++ {
		send(seq)
	}
	runtime.ReadMemStats(&after)
	// A fresh frame per block would be a block's worth each.
	frameBytes := len(block.Tuples)
	if got := after.TotalAlloc - before.TotalAlloc; got > uint64(blocks*frameBytes/4) {
		t.Fatalf("%d blocks of %d bytes allocated %d bytes: %.2f blocks' worth each, want none", blocks, frameBytes, got, float64(got)/float64(blocks*frameBytes))
	}
}
