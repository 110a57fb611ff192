package client

import (
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
