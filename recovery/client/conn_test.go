package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// TestStuckConnectionBounded: while a write hangs (the node does not
// read), calls queue their frames behind it only up to outBytesMax; the
// next is refused with an error that fails the connection, instead of the
// queue growing with every call whose caller gave up.
func TestStuckConnectionBounded(t *testing.T) {
	checkLeaks(t)
	a, b := net.Pipe() // nobody reads b
	defer b.Close()
	cn := &conn{sc: stream.NewConn(a, stream.Config{Codec: wire.CodecNone}), codec: wire.CodecNone, kick: make(chan struct{}, 1)}
	first := make(chan error, 1)
	go func() { first <- cn.send(&wire.Call{Req: 1, Proc: "upsert", Params: make([]byte, 1000)}) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		cn.outMu.Lock()
		writing := cn.writing
		cn.outMu.Unlock()
		if writing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first call never started writing")
		}
		time.Sleep(time.Millisecond)
	}
	params := make([]byte, 64<<10)
	var err error
	n := 0
	for ; n < 2*outBytesMax/len(params) && err == nil; n++ {
		err = cn.send(&wire.Call{Req: uint64(n + 2), Proc: "upsert", Params: params})
	}
	if err == nil || !strings.Contains(err.Error(), "does not read") {
		t.Fatalf("after %d calls queued behind a stuck write: %v, want the connection refused", n, err)
	}
	if len(cn.out) > outBytesMax {
		t.Fatalf("%d bytes queued, limit %d", len(cn.out), outBytesMax)
	}
	a.Close()
	select {
	case err := <-first:
		if err == nil {
			t.Fatal("the stuck write ended without an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stuck write did not end when the connection closed")
	}
}

// TestGoawayRefusesWhatItDidNotRead: a stopping node's goaway (wire.Reply
// numbered 0, RefusedStopping) says it read no call after the last it
// answered. A call in flight on the connection then fails as refused, and
// the client sends it to another node; the node is taken for stopping,
// and the next call is not sent there. Without it, the call came back
// uncertain when the node closed ("connection broken: stream: recv:
// EOF"), though it ran nowhere.
func TestGoawayRefusesWhatItDidNotRead(t *testing.T) {
	checkLeaks(t)
	ctx := testCtx(t, 30*time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := stream.Config{Codec: wire.CodecNone}
	goaway, served := make(chan struct{}), make(chan error, 1)
	go func() {
		served <- func() error {
			nc, err := ln.Accept()
			if err != nil {
				return err
			}
			sc := stream.NewConn(nc, cfg)
			defer sc.Close()
			if _, err := sc.Recv(); err != nil {
				return err
			}
			if err := sc.Send(ctx, &wire.Hello{Kind: wire.HelloClient, Node: "n1"}); err != nil {
				return err
			}
			m, err := sc.Recv()
			if err != nil {
				return err
			}
			call, ok := m.(*wire.Call)
			if !ok {
				return errors.New("expected a call")
			}
			if err := sc.Send(ctx, &wire.Reply{Req: call.Req}); err != nil {
				return err
			}
			// The second call is never read, as a stopping node's reader
			// stopped before it came.
			select {
			case <-goaway:
			case <-ctx.Done():
				return ctx.Err()
			}
			if err := sc.Send(ctx, &wire.Reply{Refused: wire.RefusedStopping, Err: "node n1 is stopping"}); err != nil {
				return err
			}
			if err := sc.CloseWrite(); err != nil {
				return err
			}
			return sc.DiscardUntilEOF(time.Now().Add(10 * time.Second))
		}()
	}()

	c := &Client{opts: Options{DialTimeout: 5 * time.Second, PipelineMax: 8}, streamCfg: cfg}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	defer func() {
		c.cancel()
		c.wg.Wait()
	}()
	n := &node{c: c, id: "n1", dialSem: make(chan struct{}, 1)}
	n.setAddr(ln.Addr().String())
	if _, sent, err := n.do(ctx, &wire.Call{Proc: "upsert"}); err != nil || !sent {
		t.Fatalf("first call: sent %v, %v", sent, err)
	}
	cn, err := n.get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		_, _, err := n.do(ctx, &wire.Call{Proc: "upsert"})
		second <- err
	}()
	for {
		cn.mu.Lock()
		inFlight := len(cn.pending)
		cn.mu.Unlock()
		if inFlight == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the second call never went out")
		}
		time.Sleep(time.Millisecond)
	}
	close(goaway)
	err = <-second
	if !errors.Is(err, ErrRefused) || !errors.Is(err, ErrStopping) || errors.Is(err, ErrUncertain) {
		t.Fatalf("call in flight at the goaway: %v, want refused (stopping), not uncertain", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("the node's side: %v", err)
	}
	if _, stopping := n.backoffUntil(); !stopping {
		t.Fatal("the node is not taken for stopping after its goaway")
	}
	if _, sent, err := cn.do(ctx, &wire.Call{Proc: "upsert"}); sent || err == nil {
		t.Fatalf("a call on the connection after the goaway: sent %v, %v; want not sent", sent, err)
	}
}
