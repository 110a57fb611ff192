package stream

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// The bounds of the buffers under a TLS connection (tlsConn).
const (
	// tlsRecordBytesMax is a full TLS record: 16 KiB of plaintext and at
	// most 256 bytes of header, content type, padding and tag (RFC 8446
	// 5.2).
	tlsRecordBytesMax = 16<<10 + 256
	// tlsHeldBytesMax bounds the records one Write holds back before it
	// writes them: sixteen full records, so that a rejoin block of 256
	// KiB leaves in one write, as it does without TLS. The buffer grows
	// to it only on a connection that writes that much at once.
	tlsHeldBytesMax = 16 * tlsRecordBytesMax
	// tlsReadBufferBytesMin and tlsReadBufferBytesMax bound the buffer
	// one read of the TCP connection fills: it starts at four full
	// records and doubles each time a read fills it (more was waiting),
	// up to sixteen, a rejoin block. A connection of small messages (a
	// feed, a client's calls) keeps the small one.
	tlsReadBufferBytesMin = 64 << 10
	tlsReadBufferBytesMax = 256 << 10
)

// Client and Server wrap a TCP connection in TLS, as tls.Client and
// tls.Server do, and return the TLS connection (for its handshake and
// state) and the connection to carry the stream over.
//
// crypto/tls writes each record, 16 KiB at most, with a write of its own
// and reads about one record per read: a 256 KiB block costs plain TCP a
// syscall or two and TLS some 30 (a measured 16 writes and 11 to 14
// reads per block). Under the TLS connection, the records of one Write
// leave in one write of up to tlsHeldBytesMax, and reads bring in up to
// tlsReadBufferBytesMax at once (readBuffer): 1.1 writes and 1.0 reads
// per block, where plain TCP makes 1.2 and 2.4 (docs/DESIGN.md "Where
// TLS costs"). Nothing waits on a later Write: the records are written
// before Write returns.
func Client(nc net.Conn, cfg *tls.Config) (*tls.Conn, net.Conn) {
	raw := newRecordConn(nc)
	tc := tls.Client(raw, cfg)
	return tc, &tlsConn{Conn: tc, raw: raw}
}

// Server is Client's accepting side.
func Server(nc net.Conn, cfg *tls.Config) (*tls.Conn, net.Conn) {
	raw := newRecordConn(nc)
	tc := tls.Server(raw, cfg)
	return tc, &tlsConn{Conn: tc, raw: raw}
}

// tlsConn is a TLS connection whose Write holds its records in raw until
// they are all encrypted, then writes them at once.
type tlsConn struct {
	*tls.Conn
	raw *recordConn
}

func (c *tlsConn) Write(p []byte) (int, error) {
	// The handshake's flights must go out while it waits for the peer's:
	// held, they would wait for the end of a handshake that needs them.
	if err := c.Conn.Handshake(); err != nil {
		return 0, err
	}
	c.raw.hold()
	n, err := c.Conn.Write(p)
	if ferr := c.raw.release(); err == nil && ferr != nil {
		return n, ferr
	}
	return n, err
}

// Close closes the connection. A Write whose held records are still
// being written is a Write in flight, and crypto/tls closes under one at
// once, without the close_notify that would wait for it (up to 5 s): so
// does Close here.
func (c *tlsConn) Close() error {
	if c.raw.releasing.Load() {
		return c.raw.Conn.Close()
	}
	return c.Conn.Close()
}

// recordConn is the TCP connection under a tlsConn: reads are buffered,
// and writes made while held are kept (up to tlsHeldBytesMax) until
// release. Writes made while not held (the handshake, alerts, a close)
// go straight out.
//
// Invariant: held is false outside a tlsConn.Write, and buf is empty
// whenever held is false.
type recordConn struct {
	net.Conn
	r readBuffer

	mu   sync.Mutex // orders the writes of crypto/tls's writers
	held bool
	buf  []byte
	err  error // of a write made while held; returned by release
	// releasing is set while release writes what was held: outside
	// crypto/tls's Write, which does not know it is still in flight.
	releasing atomic.Bool
}

func newRecordConn(nc net.Conn) *recordConn {
	return &recordConn{Conn: nc, r: readBuffer{src: nc, size: tlsReadBufferBytesMin}}
}

func (r *recordConn) Read(p []byte) (int, error) { return r.r.Read(p) }

// readBuffer is bufio.Reader's Read with a buffer that grows: crypto/tls
// asks for about a record at a time, and each read of the TCP connection
// is a system call, so a stream of full records is read in as few calls
// as the buffer allows. It starts at tlsReadBufferBytesMin and doubles,
// up to tlsReadBufferBytesMax, after a read that filled it; it never
// shrinks. One reader only (crypto/tls reads under its input lock).
//
// Invariant: buf[r:w] is unread; err, of the read that brought in
// buf[:w], is returned once that is read.
type readBuffer struct {
	src  io.Reader
	size int // of the next buffer made
	buf  []byte
	r, w int
	err  error
}

func (b *readBuffer) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.r == b.w {
		if b.err != nil {
			err := b.err
			b.err = nil
			return 0, err
		}
		if len(p) >= b.size {
			return b.src.Read(p) // as bufio: a large read needs no copy
		}
		if len(b.buf) < b.size {
			b.buf = make([]byte, b.size)
		}
		n, err := b.src.Read(b.buf)
		b.r, b.w, b.err = 0, n, err
		if n == len(b.buf) {
			b.size = min(2*len(b.buf), tlsReadBufferBytesMax)
		}
		if n == 0 {
			b.err = nil
			return 0, err
		}
	}
	n := copy(p, b.buf[b.r:b.w])
	b.r += n
	return n, nil
}

func (r *recordConn) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held {
		return r.Conn.Write(p)
	}
	if r.err != nil {
		return 0, r.err
	}
	if len(r.buf)+len(p) > tlsHeldBytesMax {
		if err := r.flushLocked(); err != nil {
			return 0, err
		}
	}
	if len(p) > tlsHeldBytesMax {
		return r.Conn.Write(p) // no record is this large; kept for safety
	}
	r.buf = append(r.buf, p...)
	return len(p), nil
}

func (r *recordConn) hold() {
	r.mu.Lock()
	r.held = true
	r.mu.Unlock()
}

// release writes what was held and stops holding.
func (r *recordConn) release() error {
	r.releasing.Store(true)
	defer r.releasing.Store(false)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = false
	err := r.flushLocked()
	r.err = nil
	return err
}

func (r *recordConn) flushLocked() error {
	if r.err != nil {
		r.buf = r.buf[:0]
		return r.err
	}
	if len(r.buf) == 0 {
		return nil
	}
	_, err := r.Conn.Write(r.buf)
	r.buf = r.buf[:0]
	r.err = err
	return err
}
