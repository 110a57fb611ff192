package stream

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/node/certs"
)

// tlsConfigs are a node's server config and a dialler's, from a new CA.
func tlsConfigs(t *testing.T) (srv, cli *tls.Config) {
	t.Helper()
	ca, err := certs.NewCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	n1, err := ca.Credentials(certs.NodeID(1), certs.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n2, err := ca.Credentials(certs.NodeID(2), certs.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n2.ServerConfig(), n1.DialConfig("n2")
}

// countingConn counts the writes made on a connection.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// tcpPair is two ends of a loopback TCP connection, each with a 10 s
// deadline so that a stuck test fails instead of hanging.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		nc, _ := ln.Accept()
		accepted <- nc
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if b = <-accepted; b == nil {
		t.Fatal("accept failed")
	}
	for _, c := range []net.Conn{a, b} {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

// TestTLSRecordsLeaveTogether: the records of one large Write leave
// together (crypto/tls alone makes one write per 16 KiB record: 16 for
// 256 KiB, a rejoin block), and arrive intact.
func TestTLSRecordsLeaveTogether(t *testing.T) {
	srvCfg, cliCfg := tlsConfigs(t)
	a, b := tcpPair(t)
	counted := &countingConn{Conn: a}
	ctc, cc := Client(counted, cliCfg)
	_, sc := Server(b, srvCfg)
	msg := make([]byte, 256<<10)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	// Twice: crypto/tls starts a connection with small records, full ones
	// from 128 KiB on; the second Write is the steady state.
	got := make([]byte, 2*len(msg))
	var wg sync.WaitGroup
	var readErr error
	wg.Go(func() { _, readErr = io.ReadFull(sc, got) }) // the server's handshake runs in it
	if err := ctc.Handshake(); err != nil {
		t.Fatal(err)
	}
	var writes int64
	for range 2 {
		before := counted.writes.Load()
		if _, err := cc.Write(msg); err != nil {
			t.Fatal(err)
		}
		writes = counted.writes.Load() - before
	}
	wg.Wait()
	if readErr != nil {
		t.Fatal(readErr)
	}
	if !bytes.Equal(got[:len(msg)], msg) || !bytes.Equal(got[len(msg):], msg) {
		t.Fatal("the bytes read differ from those written")
	}
	// 256 KiB is 16 full records (and a few bytes of the 17th: each
	// record's header and tag), which go in one write.
	if writes > 2 {
		t.Fatalf("256 KiB left in %d writes, want at most 2 (16 records in one write)", writes)
	}
}

// TestTLSServerWritesFirst: a server whose first act is a Write (its
// handshake runs inside it) still completes: the handshake's flights are
// not held back with the records.
func TestTLSServerWritesFirst(t *testing.T) {
	srvCfg, cliCfg := tlsConfigs(t)
	a, b := tcpPair(t)
	_, cc := Client(a, cliCfg)
	_, sc := Server(b, srvCfg)
	errc := make(chan error, 1)
	go func() {
		_, err := sc.Write([]byte("hello"))
		errc <- err
	}()
	got := make([]byte, 5)
	if _, err := io.ReadFull(cc, got); err != nil || string(got) != "hello" {
		t.Fatalf("read %q, %v", got, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestTLSConnCloseWriteAndStall: over TLS, a Conn's frames arrive, then
// EOF after CloseWrite (TLS's close_notify is not held back), and a
// silent link still fails Recv with ErrStalled.
func TestTLSConnCloseWriteAndStall(t *testing.T) {
	srvCfg, cliCfg := tlsConfigs(t)
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
		tc, sc := Server(nc, srvCfg)
		if err := tc.Handshake(); err != nil {
			nc.Close()
			accepted <- nil
			return
		}
		accepted <- sc
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := Config{StallWindow: 200 * time.Millisecond}
	dcfg := cfg
	dcfg.TLS = cliCfg
	client, err := Dial(ctx, ln.Addr().String(), dcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	nc := <-accepted
	if nc == nil {
		t.Fatal("accept failed")
	}
	server := NewConn(nc, cfg)
	defer server.Close()

	msgs := sampleMessages()
	for _, m := range msgs {
		if err := client.Write(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	for i := range msgs {
		m, err := server.Recv()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if m.Type() != msgs[i].Type() {
			t.Fatalf("frame %d is %v, want %v", i, m.Type(), msgs[i].Type())
		}
	}
	if _, err := server.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseWrite: %v, want EOF", err)
	}
	if _, err := client.Recv(); !errors.Is(err, ErrStalled) {
		t.Fatalf("recv on a silent TLS link: %v, want ErrStalled", err)
	}
}

// TestTLSCloseUnblocksHeldWrite: a Write stuck writing its held records
// to a peer that reads nothing ends as soon as the connection is closed,
// as a stuck crypto/tls Write does, not after close_notify's 5 s.
func TestTLSCloseUnblocksHeldWrite(t *testing.T) {
	srvCfg, cliCfg := tlsConfigs(t)
	a, b := tcpPair(t)
	ctc, cc := Client(a, cliCfg)
	stc, _ := Server(b, srvCfg)
	hs := make(chan error, 1)
	go func() { hs <- stc.Handshake() }() // then the server reads nothing
	if err := ctc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-hs; err != nil {
		t.Fatal(err)
	}
	// Writes of three records each: all held, written by release, where
	// one blocks once the peer's buffers are full.
	chunk := make([]byte, 3*16<<10)
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := cc.Write(chunk); err != nil {
				done <- err
				return
			}
		}
	}()
	time.Sleep(500 * time.Millisecond) // the writer fills the buffers and blocks
	select {
	case err := <-done:
		t.Fatalf("the writer ended before the close: %v", err)
	default:
	}
	start := time.Now()
	if err := cc.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Logf("close: %v", err)
	}
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("the blocked Write did not end within 3 s of the close")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("close took %s", took)
	}
}

// chunkSource is a connection's input as reads see it: each read returns
// at most chunk bytes (what has arrived), then err once all is read.
type chunkSource struct {
	data  []byte
	chunk int
	err   error
	reads int
}

func (s *chunkSource) Read(p []byte) (int, error) {
	s.reads++
	if len(s.data) == 0 {
		return 0, s.err
	}
	n := copy(p, s.data[:min(len(s.data), s.chunk)])
	s.data = s.data[n:]
	return n, nil
}

// TestTLSReadBufferGrows: a stream of full records, read as crypto/tls
// reads it (about a record at a time), is brought in by reads that grow
// to tlsReadBufferBytesMax (4 MiB in 19 reads, the last its EOF, where
// a fixed 64 KiB buffer takes 65); a connection whose reads bring in little keeps the
// small buffer; every byte arrives in order, and the source's error
// after the last.
func TestTLSReadBufferGrows(t *testing.T) {
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i * 13)
	}
	wantErr := errors.New("the end")
	for _, tc := range []struct {
		name      string
		chunk     int
		readsMax  int
		sizeAfter int
	}{
		{"a rejoin stream", len(data), 19, tlsReadBufferBytesMax},
		{"small messages", 200, len(data)/200 + 2, tlsReadBufferBytesMin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &chunkSource{data: data, chunk: tc.chunk, err: wantErr}
			rb := &readBuffer{src: src, size: tlsReadBufferBytesMin}
			var got []byte
			p := make([]byte, 16<<10+256) // a record, as crypto/tls asks
			var err error
			for err == nil {
				var n int
				n, err = rb.Read(p[:1+len(got)%len(p)]) // sizes from 1 to a record
				got = append(got, p[:n]...)
			}
			if !errors.Is(err, wantErr) || !bytes.Equal(got, data) {
				t.Fatalf("read %d of %d bytes (equal %v), then %v; want all, then %v", len(got), len(data), bytes.Equal(got, data), err, wantErr)
			}
			if src.reads > tc.readsMax {
				t.Errorf("%d reads of the connection, want at most %d", src.reads, tc.readsMax)
			}
			if len(rb.buf) != tc.sizeAfter {
				t.Errorf("buffer of %d bytes, want %d", len(rb.buf), tc.sizeAfter)
			}
		})
	}
}
