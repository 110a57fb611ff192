package node

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// BenchmarkReadRejoin measures a destination's read loop
// (readRejoinInto) over loopback TCP: snapshot blocks of about 256 KiB
// (benchBlock), read, copied and handed to a consumer that gives each
// block's buffer back, as the replica goroutine does once it applied the
// block (the apply itself is not measured). At most linkBenchWindow
// blocks are in flight, the source's window. bufs=none copies each block
// into a fresh buffer, as the read loop did before it kept a free list;
// bufs=reuse into the buffers given back. cpu-ns/op is the process's CPU
// (sender, reader and consumer) per block.
//
//	go test -run '^$' -bench BenchmarkReadRejoin -benchtime 2000x ./recovery/node/
func BenchmarkReadRejoin(b *testing.B) {
	for _, reuse := range []bool{false, true} {
		b.Run("bufs="+map[bool]string{false: "none", true: "reuse"}[reuse], func(b *testing.B) {
			benchReadRejoin(b, reuse)
		})
	}
}

func benchReadRejoin(b *testing.B, reuse bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	cfg := stream.DefaultConfig()
	cfg.Codec = wire.CodecNone
	frame, err := wire.AppendFrame(nil, benchBlock(), wire.CodecNone)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	window := make(chan struct{}, linkBenchWindow) // a token per block in flight
	sent := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			sent <- err
			return
		}
		c := stream.NewConn(nc, cfg)
		defer c.Close()
		for range b.N {
			select {
			case window <- struct{}{}:
			case <-ctx.Done():
				sent <- ctx.Err()
				return
			}
			if err := c.SendFrame(ctx, frame); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	conn, err := stream.Dial(ctx, ln.Addr().String(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	var bufs freeBufs
	if reuse {
		bufs = newFreeBufs()
	}
	got := make(chan wire.Message, linkBenchWindow)
	consumed := make(chan int, 1)
	go func() {
		n := 0
		for m := range got {
			giveBlock(bufs, m)
			<-window
			if n++; n == b.N {
				conn.Close() // the reader ends with its connection
			}
		}
		consumed <- n
	}()
	node := &Node{log: testLog(b)}
	b.SetBytes(int64(len(frame)))
	b.ResetTimer()
	cpu0 := processCPU(b)
	node.readRejoinInto(ctx, conn, bufs, func(context.Context) {}, func(m wire.Message) { got <- m })
	close(got)
	b.StopTimer()
	// The process's CPU: the sender's share is the same either way.
	b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	if err := <-sent; err != nil {
		b.Fatal(err)
	}
	if n := <-consumed; n != b.N {
		b.Fatalf("%d blocks read, want %d", n, b.N)
	}
}
