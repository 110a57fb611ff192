package node

import (
	"context"
	"net"
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
