package faultnet

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes each connection back and sends the error that ended
// each one's read on errs.
func echoServer(t *testing.T) (addr string, errs <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, err := io.Copy(c, c)
				select {
				case ch <- err:
				default:
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), ch
}

func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads it back, bounded by a second.
func roundTrip(c net.Conn, msg []byte) error {
	if err := c.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return errors.New("echo differs")
	}
	return nil
}

// readErr is the error of a read of c, bounded by a second.
func readErr(c net.Conn) error {
	if err := c.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	_, err := c.Read(make([]byte, 1))
	return err
}

func TestResetSendsRST(t *testing.T) {
	target, serverErrs := echoServer(t)
	p := startProxy(t, target)
	c := dial(t, p.Addr())
	if err := roundTrip(c, []byte("before")); err != nil {
		t.Fatal(err)
	}
	p.Reset(0)
	if err := readErr(c); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read after Reset: %v, want ECONNRESET", err)
	}
	select {
	case err := <-serverErrs:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("server read after Reset: %v, want ECONNRESET", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the server's connection outlived the Reset")
	}
	// No window: the next connection is relayed.
	if err := roundTrip(dial(t, p.Addr()), []byte("after")); err != nil {
		t.Fatal(err)
	}
}

func TestResetRefusesForItsWindow(t *testing.T) {
	target, _ := echoServer(t)
	p := startProxy(t, target)
	const window = 500 * time.Millisecond
	end := time.Now().Add(window)
	p.Reset(window)
	// The kernel completes the handshake and the proxy resets it: the
	// RST may come before the dial returns, or fail the first read.
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err == nil {
		err = readErr(c)
		c.Close()
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("dial and read in the window: %v, want ECONNRESET", err)
	}
	time.Sleep(time.Until(end) + 50*time.Millisecond)
	if err := roundTrip(dial(t, p.Addr()), []byte("relayed again")); err != nil {
		t.Fatalf("after the window: %v", err)
	}
}

func TestFreezeHoldsBytes(t *testing.T) {
	target, _ := echoServer(t)
	p := startProxy(t, target)
	c := dial(t, p.Addr())
	p.Freeze()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	var ne net.Error
	if err := c.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 4)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read while frozen: %v, want a timeout", err)
	}
	p.Thaw()
	got := make([]byte, 4)
	if err := c.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "held" {
		t.Fatalf("after thaw: %q, %v", got, err)
	}
}
