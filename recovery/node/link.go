package node

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// linkFramesMax bounds the frames of one rejoin waiting for the
// connection. The source's window bounds its blocks well below; the rest
// are heartbeats and control messages. Reaching it ends the attempt.
const linkFramesMax = 4096

// The buffers a freeBufs keeps for reuse (a link's frames, a
// destination's received blocks): at most linkFreeFramesMax of them, none
// larger than linkFreeFrameBytesMax, so each keeps at most 16 MiB it is
// not using. The source's window (recovery.SourceConfig.WindowBlocksMax,
// 16 by default) bounds the blocks in flight either way.
const (
	linkFreeFramesMax     = 16
	linkFreeFrameBytesMax = 1 << 20
)

// freeBufs is a bounded free list of byte buffers between two goroutines:
// one takes a buffer to fill, the other gives it back once nothing reads
// it any more. A buffer is in the list or in one user's hands, never both;
// one not given back (an attempt that ended with it in flight) is the
// collector's.
type freeBufs chan []byte

func newFreeBufs() freeBufs { return make(freeBufs, linkFreeFramesMax) }

// take returns an empty buffer given back before, or nil.
func (f freeBufs) take() []byte {
	select {
	case b := <-f:
		return b[:0]
	default:
		return nil
	}
}

// give keeps b for a later take; when the list is full or b is large,
// the collector takes it.
func (f freeBufs) give(b []byte) {
	if cap(b) > linkFreeFrameBytesMax || cap(b) == 0 {
		return
	}
	select {
	case f <- b:
	default:
	}
}

// The bounds of one batch of frames the link's writer writes before it
// flushes (writeBatch): the connection's write buffer, and a count that
// bounds how long the first frame of a batch of tiny ones waits.
const (
	linkBatchBytesMax  = 64 << 10
	linkBatchFramesMax = 64
)

// link is the connection side of one rejoin attempt. The replica goroutine
// encodes the processor's messages into frames at once (a block's tuples
// are only valid until the processor is called again) and queues them; a
// writer goroutine per connection sends them. A new connection replaces
// the old one: the old writer has ended before the new one starts, and the
// frames queued for the broken connection are dropped in the same replica
// event that calls the processor's Resume, which sends again whatever the
// peer may have lost.
type link struct {
	frames chan []byte
	// free holds frame buffers the writer has written, for queue to
	// encode the next frames into. A block's frame is about 256 KiB;
	// encoded into fresh memory each time, the page faults and zeroing
	// cost the source several times the copy itself (BenchmarkLink,
	// encode=queue).
	free freeBufs
	// pending and enc belong to the replica goroutine.
	pending [][]byte
	enc     wire.FrameEncoder
	codec   wire.Codec

	// unsent counts frames handed to the channel and not yet written (or
	// dropped): drain waits for it to reach zero.
	unsent atomic.Int32

	// pace spaces the writes of a source's snapshot (pace.go); written
	// counts the bytes written, for the pacer's windows.
	pace    *rate.Limiter
	written atomic.Int64

	mu         sync.Mutex
	conn       *stream.Conn
	stop       chan struct{} // closed to end the current writer
	writerDone chan struct{}
}

func newLink(codec wire.Codec) *link {
	return &link{frames: make(chan []byte, linkFramesMax), free: newFreeBufs(), codec: codec,
		pace: rate.NewLimiter(rate.Inf, 0)}
}

// queue encodes msgs and queues them; replica goroutine only.
func (l *link) queue(msgs []wire.Message) error {
	for _, m := range msgs {
		f, err := l.enc.AppendFrame(l.free.take(), m, l.codec)
		if err != nil {
			return fmt.Errorf("encode %v: %w", m.Type(), err)
		}
		l.pending = append(l.pending, f)
	}
	l.flush()
	if len(l.pending) > linkFramesMax {
		return fmt.Errorf("%d frames wait for the connection, limit %d", len(l.pending), linkFramesMax)
	}
	return nil
}

// flush moves queued frames to the writer without waiting.
func (l *link) flush() {
	for len(l.pending) > 0 {
		select {
		case l.frames <- l.pending[0]:
			l.unsent.Add(1)
			l.pending[0] = nil
			l.pending = l.pending[1:]
		default:
			return
		}
	}
}

// drop discards every queued frame; replica goroutine only, before Resume.
func (l *link) drop() {
	l.pending = nil
	for {
		select {
		case <-l.frames:
			l.unsent.Add(-1)
		default:
			return
		}
	}
}

// attach makes c the link's connection: the old one is closed and its
// writer waited for. The caller then drops and resumes on the replica
// goroutine, and starts the new writer with run.
func (l *link) attach(c *stream.Conn) {
	l.mu.Lock()
	old, stop, done := l.conn, l.stop, l.writerDone
	l.conn, l.stop, l.writerDone = c, nil, nil
	l.mu.Unlock()
	if old != nil {
		old.Close()
	}
	if stop != nil {
		close(stop) // an idle writer does not see its connection close
	}
	if done != nil {
		<-done
	}
}

// run starts the writer of c, which ends when c fails or is closed.
func (l *link) run(ctx context.Context, c *stream.Conn, pause func(context.Context)) {
	done, stop := make(chan struct{}), make(chan struct{})
	l.mu.Lock()
	l.writerDone, l.stop = done, stop
	l.mu.Unlock()
	go func() {
		defer close(done)
		for {
			select {
			case f := <-l.frames:
				pause(ctx)
				err := l.writeBatch(ctx, stop, c, f)
				if err != nil {
					c.Close()
					return
				}
			case <-ctx.Done():
				c.Close()
				return
			case <-stop:
				return
			}
		}
	}()
}

// writeBatch writes f and the frames queued behind it, up to
// linkBatchBytesMax and linkBatchFramesMax, then flushes once: small
// frames (acks, heartbeats, catch-up txns) share one syscall and one TLS
// record instead of one each. The flush comes as soon as the queue is
// empty, before the writer would wait, so no frame waits for a later one;
// a frame of linkBatchBytesMax or more goes alone, as before. A pause
// (fault injection) applies before each batch: at most linkBatchBytesMax
// late.
func (l *link) writeBatch(ctx context.Context, stop <-chan struct{}, c *stream.Conn, f []byte) error {
	n, size := 0, 0
	defer func() { l.unsent.Add(-int32(n)) }()
	for {
		n++
		size += len(f)
		// At the snapshot's pace (pace.go), after writing out what the
		// connection buffered; a stop (the connection replaced) ends the
		// wait.
		if err := stream.WaitBytes(ctx, l.pace, len(f), stop, c.Flush); err != nil {
			return err
		}
		l.written.Add(int64(len(f)))
		err := c.WriteFrame(ctx, f)
		// Written or failed, f is no longer read: the connection's
		// buffer and TLS keep copies, not f.
		l.free.give(f)
		if err != nil {
			return err
		}
		if size >= linkBatchBytesMax || n >= linkBatchFramesMax {
			break
		}
		select {
		case f = <-l.frames:
			continue
		default:
		}
		break
	}
	return c.Flush()
}

// setPace sets the rate of the link's writes in bytes per second (0:
// unlimited), with a twentieth of a second of credit (at least
// linkBatchBytesMax) for an idle link.
func (l *link) setPace(bytesPerSec float64) {
	l.pace.SetBurst(max(int(bytesPerSec/20), linkBatchBytesMax))
	l.pace.SetLimit(paceLimit(bytesPerSec))
}

// drain waits, up to d, until every queued frame is written: an attempt's
// last messages (the handoff, an abort) go out before it closes.
func (l *link) drain(d time.Duration) {
	deadline := time.Now().Add(d)
	for l.unsent.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// closeWrite half-closes the current connection once its frames are out:
// the peer reads everything, then EOF. A full close with the peer's acks
// unread would send a reset, and the peer could lose the last frames.
func (l *link) closeWrite() {
	l.mu.Lock()
	c := l.conn
	l.mu.Unlock()
	if c != nil {
		_ = c.CloseWrite()
	}
}

// cut closes the current connection (a fault, or the attempt's end).
func (l *link) cut() {
	l.mu.Lock()
	c := l.conn
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// close ends the link: the connection closed, its writer ended.
func (l *link) close() {
	l.attach(nil)
}
