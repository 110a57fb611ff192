package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// BenchmarkLink measures a rejoin link's writer (link.run) over loopback
// TCP into a reader that decodes every frame: frame=block is a snapshot
// block (256 KiB of 16-byte keys and 100-byte values, the demo's rows,
// codec none as the nodes' default), frame=small a 30-byte ack, sent in
// bursts of 16 as a source's acks and heartbeats can come. tls=on is the
// nodes' mutual TLS 1.3, tls=off their --insecure: side by side, what
// TLS costs the stream. encode=none hands the writer one frame encoded
// beforehand, over and over; encode=queue encodes each block through
// link.queue as a source does, at most linkBenchWindow frames ahead of
// the writer (the source's window).
//
//	go test -run '^$' -bench BenchmarkLink -benchtime 2000x ./recovery/node/
func BenchmarkLink(b *testing.B) {
	for _, fc := range []struct {
		name   string
		msg    wire.Message
		burst  int
		encode bool
	}{
		{"block", benchBlock(), 1, false},
		{"block", benchBlock(), 1, true},
		{"small", &wire.Ack{MsgHeader: wire.MsgHeader{Epoch: 7, Partition: 3}, Seq: 1 << 40}, 16, false},
	} {
		for _, on := range []bool{true, false} {
			b.Run(fmt.Sprintf("frame=%s/encode=%s/tls=%s", fc.name, map[bool]string{false: "none", true: "queue"}[fc.encode], onOff(on)), func(b *testing.B) {
				benchLink(b, fc.msg, fc.burst, on, fc.encode)
			})
		}
	}
}

// linkBenchWindow bounds the frames encode=queue has queued and the
// writer not yet written.
const linkBenchWindow = 16

// benchBlock is a block of about 256 KiB of rows like the demo's.
func benchBlock() *wire.Block {
	var w wire.BlockWriter
	w.Reset(wire.MsgHeader{Epoch: 7, Partition: 3}, wire.BlockSnapshot, 0, 1)
	val := make([]byte, 100)
	for i := 0; w.TupleBytes() < 256<<10-200; i++ {
		for j := range val {
			val[j] = byte(i*31 + j)
		}
		if err := w.AppendTuple([]wire.Value{wire.Bytes(fmt.Appendf(nil, "key-%012d", i)), wire.Bytes(val)}); err != nil {
			panic(err)
		}
	}
	return w.Block()
}

func benchLink(b *testing.B, msg wire.Message, burst int, on, encode bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	cfg := stream.DefaultConfig()
	cfg.Codec = wire.CodecNone
	var srvTLS *tls.Config
	dcfg := cfg
	if on {
		srvTLS = testCreds(b, certs.NodeID(2)).ServerConfig()
		dcfg.TLS = testCreds(b, certs.NodeID(1)).DialConfig("n2")
	}
	frames := b.N * burst
	got := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		if srvTLS != nil {
			_, nc = stream.Server(nc, srvTLS)
		}
		c := stream.NewConn(nc, cfg)
		defer c.Close()
		for range frames {
			if _, err := c.Recv(); err != nil {
				got <- err
				return
			}
		}
		got <- nil
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	conn, err := stream.Dial(ctx, ln.Addr().String(), dcfg)
	if err != nil {
		b.Fatal(err)
	}
	l := newLink(wire.CodecNone)
	defer l.close()
	var enc wire.FrameEncoder
	frame, err := enc.AppendFrame(nil, msg, wire.CodecNone)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(frame) * burst))
	l.attach(conn)
	b.ResetTimer()
	l.run(ctx, conn, func(context.Context) {})
	for range b.N {
		for range burst {
			if encode {
				for l.unsent.Load() >= linkBenchWindow {
					time.Sleep(20 * time.Microsecond)
				}
				if err := l.queue([]wire.Message{msg}); err != nil {
					b.Fatal(err)
				}
				continue
			}
			// The writer only reads a frame: one encoding serves every send.
			l.unsent.Add(1)
			l.frames <- frame
		}
	}
	if err := <-got; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}
