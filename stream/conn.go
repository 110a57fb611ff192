package stream

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/rejoin-db/rejoin/wire"
	"golang.org/x/time/rate"
)

// Errors of a stream, classified with errors.Is.
var (
	// ErrStalled: no frame arrived within the stall window.
	ErrStalled = errors.New("stream: stalled: no frame within the stall window")
	// ErrClosed: the connection was closed by this side.
	ErrClosed = errors.New("stream: closed")
)

// Config sets a connection's limits.
type Config struct {
	// Codec compresses outgoing frames (each frame says which it used).
	Codec wire.Codec
	// StallWindow: Recv fails with ErrStalled when no frame arrives for this
	// long (up to half as long again: the read deadline moves in steps).
	// The rejoin processors send heartbeats well inside it, so a quiet but
	// healthy peer never trips it. Zero means no stall detection.
	StallWindow time.Duration
	// RateBytesPerSec limits what Send writes; zero means unlimited.
	RateBytesPerSec int64
	// KeepAlive is the TCP keepalive period, so a peer that vanished
	// without a FIN is noticed by the kernel too; zero keeps the system's.
	KeepAlive time.Duration
	// TLS, if set, makes Dial a TLS client with it: the handshake is done,
	// under Dial's context, before Dial returns. Nil means plain TCP.
	TLS *tls.Config
}

// DefaultConfig: s2 frames, a 10 s stall window, no rate limit, 5 s TCP
// keepalive.
func DefaultConfig() Config {
	return Config{Codec: wire.CodecS2, StallWindow: 10 * time.Second, KeepAlive: 5 * time.Second}
}

// Conn carries wire frames over one net.Conn. Send and Recv may be called
// from two goroutines (one sender, one receiver); each alone is not safe
// for concurrent use. Nothing is buffered without bound: Send writes the
// frame before it returns, and Recv reads exactly one frame.
type Conn struct {
	nc  net.Conn
	cfg Config

	sendMu  sync.Mutex
	enc     wire.FrameEncoder
	w       *bufio.Writer
	frame   []byte
	limiter *rate.Limiter

	dec     wire.FrameDecoder
	r       *bufio.Reader
	hdr     [wire.FrameHeaderBytes]byte
	payload []byte
	// frameMax, if set, bounds the frames Recv takes (SetFrameBytesMax).
	frameMax int
	// deadline is the read deadline set last (Recv, StallWindow).
	deadline time.Time

	closeOnce sync.Once
	closed    chan struct{}
}

// NewConn wraps nc.
func NewConn(nc net.Conn, cfg Config) *Conn {
	SetKeepAlive(nc, cfg.KeepAlive)
	c := &Conn{
		nc:     nc,
		cfg:    cfg,
		w:      bufio.NewWriterSize(nc, 64<<10),
		r:      bufio.NewReaderSize(nc, 64<<10),
		closed: make(chan struct{}),
	}
	if cfg.RateBytesPerSec > 0 {
		c.limiter = newLimiter(cfg.RateBytesPerSec)
	}
	return c
}

// Dial connects to addr and wraps the connection.
func Dial(ctx context.Context, addr string, cfg Config) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("stream: dial %s: %w", addr, err)
	}
	if cfg.TLS != nil {
		SetKeepAlive(nc, cfg.KeepAlive) // the TLS conn hides the TCP one
		tc, sc := Client(nc, cfg.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("stream: dial %s: tls: %w", addr, err)
		}
		nc = sc
	}
	return NewConn(nc, cfg), nil
}

// SetKeepAlive sets a TCP connection's keepalive period (if period > 0);
// other connections are left alone.
func SetKeepAlive(nc net.Conn, period time.Duration) {
	if tc, ok := nc.(*net.TCPConn); ok && period > 0 {
		_ = tc.SetKeepAlive(true)
		_ = tc.SetKeepAlivePeriod(period)
	}
}

// Send encodes m in one frame and writes it, waiting for the rate limit
// first. A Block's tuples are not retained after Send returns.
func (c *Conn) Send(ctx context.Context, m wire.Message) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.write(ctx, m); err != nil {
		return err
	}
	if err := c.w.Flush(); err != nil {
		return c.ioErr("send", err)
	}
	return nil
}

// Write is Send without the flush: the frame may wait in the connection's
// buffer (64 KiB, bounded) until Flush or a later write fills it. A feed
// writes a burst of small messages and flushes once, instead of one
// syscall per transaction.
func (c *Conn) Write(ctx context.Context, m wire.Message) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.write(ctx, m)
}

// Flush writes what Write buffered.
func (c *Conn) Flush() error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.w.Flush(); err != nil {
		return c.ioErr("send", err)
	}
	return nil
}

// SendFrame writes a frame encoded by the caller (wire.FrameEncoder) and
// flushes, under the rate limit like Send. A processor's block must be
// encoded before the processor is called again; its driver encodes on
// its own goroutine and hands the bytes to the connection's writer.
func (c *Conn) SendFrame(ctx context.Context, frame []byte) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.writeFrame(ctx, frame); err != nil {
		return err
	}
	if err := c.w.Flush(); err != nil {
		return c.ioErr("send", err)
	}
	return nil
}

// WriteFrame is SendFrame without the flush, as Write is Send's: a
// writer with more frames queued writes them all and flushes once, so
// small frames share a syscall (and a TLS record).
func (c *Conn) WriteFrame(ctx context.Context, frame []byte) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.writeFrame(ctx, frame)
}

func (c *Conn) writeFrame(ctx context.Context, frame []byte) error {
	if c.limiter != nil {
		// The frames written before go out first: the rate limit's wait
		// must not hold them too.
		if c.w.Buffered() > 0 {
			if err := c.w.Flush(); err != nil {
				return c.ioErr("send", err)
			}
		}
		if err := WaitBytes(ctx, c.limiter, len(frame), c.closed, nil); err != nil {
			return err
		}
	}
	if _, err := c.w.Write(frame); err != nil {
		return c.ioErr("send", err)
	}
	return nil
}

func (c *Conn) write(ctx context.Context, m wire.Message) error {
	frame, err := c.enc.AppendFrame(c.frame[:0], m, c.cfg.Codec)
	if err != nil {
		return err
	}
	c.frame = frame
	if c.limiter != nil {
		if err := WaitBytes(ctx, c.limiter, len(frame), c.closed, nil); err != nil {
			return err
		}
	}
	if _, err := c.w.Write(frame); err != nil {
		return c.ioErr("send", err)
	}
	return nil
}

// SetStallWindow changes Config.StallWindow from the next Recv on: a
// connection whose kind its first message tells (an accepted one, after
// its hello) learns only then how long it may be silent. Call it from
// the goroutine that calls Recv, never during one.
func (c *Conn) SetStallWindow(d time.Duration) {
	c.cfg.StallWindow, c.deadline = d, time.Time{}
}

// SetFrameBytesMax bounds the frames Recv takes from the next Recv on,
// in payload bytes as sent and after decompression; 0 restores the wire's
// own limits. A frame over it is refused with wire.ErrTooLarge before any
// of its payload is read. An accepted connection is bounded until its
// hello is checked: until then nobody is accountable for what it sends.
// Call it from the goroutine that calls Recv, never during one.
func (c *Conn) SetFrameBytesMax(n int) { c.frameMax = n }

// payloadChunkBytes is what Recv allocates first for a payload it does
// not have room for, and the least it grows by after.
const payloadChunkBytes = 64 << 10

// Recv reads one frame and decodes it. The message, a Block's tuples
// included, is valid until the next Recv. A frame that does not decode
// is an error of its own kind (wire's), distinct from a broken link.
func (c *Conn) Recv() (wire.Message, error) {
	if w := c.cfg.StallWindow; w > 0 {
		// The deadline moves only when less than the window is left,
		// to half a window past it: a busy feed reads tens of thousands
		// of frames a second, and each move is a lock and a timer in the
		// runtime. A peer silent for less than the window never trips it;
		// one silent for the window trips it within half a window more.
		if now := time.Now(); c.deadline.Sub(now) < w {
			c.deadline = now.Add(w + w/2)
			if err := c.nc.SetReadDeadline(c.deadline); err != nil {
				return nil, c.ioErr("recv", err)
			}
		}
	}
	if _, err := io.ReadFull(c.r, c.hdr[:]); err != nil {
		return nil, c.ioErr("recv", err)
	}
	h, err := wire.ParseFrameHeader(c.hdr[:])
	if err != nil {
		return nil, err
	}
	if max := c.frameMax; max > 0 && (h.PayloadBytes > max || h.RawBytes > max) {
		return nil, fmt.Errorf("%w: %v frame of %d bytes (%d decompressed), limit %d here", wire.ErrTooLarge, h.Type, h.PayloadBytes, h.RawBytes, max)
	}
	if err := c.readPayload(h.PayloadBytes); err != nil {
		return nil, c.ioErr("recv", err)
	}
	return c.dec.DecodePayload(h, c.payload)
}

// readPayload reads the next n bytes into c.payload. The buffer grows as
// the bytes arrive, doubling, never to what a header announced before it
// is sent: a header costs its sender 14 bytes, its reader up to 8 MiB.
// A connection that once read a large frame keeps its buffer, so the
// copies of growing are paid once.
func (c *Conn) readPayload(n int) error {
	p := c.payload[:0]
	for len(p) < n {
		if len(p) == cap(p) {
			p = slices.Grow(p, min(n-len(p), max(len(p), payloadChunkBytes)))
		}
		end := min(n, cap(p))
		got, err := io.ReadFull(c.r, p[len(p):end])
		p = p[:len(p)+got]
		if err != nil {
			c.payload = p[:0]
			if errors.Is(err, io.EOF) && len(p) > 0 {
				err = io.ErrUnexpectedEOF // as one ReadFull of the payload says
			}
			return err
		}
	}
	c.payload = p
	return nil
}

// ioErr classifies an I/O error: our own close, the stall deadline, or the
// link itself.
func (c *Conn) ioErr(op string, err error) error {
	select {
	case <-c.closed:
		return fmt.Errorf("%w (%s)", ErrClosed, op)
	default:
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w: %s after %v", ErrStalled, op, c.cfg.StallWindow)
	}
	return fmt.Errorf("stream: %s: %w", op, err)
}

// SetReadDeadline sets the deadline of the Recv under way and the next
// ones, for a connection with no stall window (Recv moves its own
// deadline otherwise): a time past stops a reader blocked in Recv, which
// returns ErrStalled, with a frame it was reading part way lost.
func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.nc.SetReadDeadline(t)
}

// DiscardUntilEOF reads and drops whatever comes until the peer closes
// its side or deadline passes, and says which (nil for the close). A
// Close with input unread sends a TCP reset, which may take the frames
// sent last with it before the peer reads them: a side that has said its
// last word reads until the peer's close first.
func (c *Conn) DiscardUntilEOF(deadline time.Time) error {
	if err := c.nc.SetReadDeadline(deadline); err != nil {
		return c.ioErr("recv", err)
	}
	if _, err := io.Copy(io.Discard, c.r); err != nil {
		return c.ioErr("recv", err)
	}
	return nil
}

// Close closes the connection; a blocked Send or Recv returns ErrClosed.
func (c *Conn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closed)
		err = c.nc.Close()
	})
	return err
}

// CloseWrite flushes and shuts down the sending side (TCP, or TLS over
// TCP, which sends its close_notify first): the peer
// reads every frame sent, then EOF, while this side can still read. A
// full Close with unread input sends a reset instead, and the peer may
// lose frames it had not read yet.
func (c *Conn) CloseWrite() error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.w.Flush(); err != nil {
		return c.ioErr("send", err)
	}
	if tc, ok := c.nc.(interface{ CloseWrite() error }); ok {
		return tc.CloseWrite()
	}
	return nil
}

// LocalAddr and RemoteAddr are the connection's ends.
func (c *Conn) LocalAddr() net.Addr  { return c.nc.LocalAddr() }
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// Listen listens for stream connections on addr; an empty addr means
// loopback on a free port.
func Listen(addr string) (net.Listener, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("stream: listen %s: %w", addr, err)
	}
	return ln, nil
}
