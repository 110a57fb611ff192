package node

import (
	"context"

	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// What the source side (source.go) and the destination side
// (destination.go) of a rejoin share: the replica's flush of both links,
// and the read loop of an attempt's connection.

// flushRejoins moves queued frames on to the writers.
func (r *replica) flushRejoins() {
	if r.src != nil {
		r.src.link.flush()
	}
	if r.dst != nil && !r.dst.live {
		r.dst.link.flush()
	}
}

func ended(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// readRejoin reads the peer's messages until the connection ends. A
// message is copied: the connection reuses its buffer at the next read.
func (n *Node) readRejoin(ctx context.Context, conn *stream.Conn, pause func(context.Context), deliver func(wire.Message)) {
	n.readRejoinInto(ctx, conn, nil, pause, deliver)
}

// readRejoinInto is readRejoin copying each Block's tuples into a buffer
// taken from bufs (nil: a new one). The receiver of a block gives its
// buffer back (giveBlock) once nothing reads the block any more; a block
// of 256 KiB copied into fresh memory costs its page faults and zeroing
// on top of the copy.
func (n *Node) readRejoinInto(ctx context.Context, conn *stream.Conn, bufs freeBufs, pause func(context.Context), deliver func(wire.Message)) {
	for {
		m, err := conn.Recv()
		if err != nil {
			return
		}
		if !m.Type().Rejoin() {
			n.log.Warn("rejoin connection: unexpected message; closing", "type", m.Type())
			return
		}
		pause(ctx)
		if b, ok := m.(*wire.Block); ok {
			c := *b
			c.Tuples = append(bufs.take(), b.Tuples...)
			m = &c
		}
		deliver(m)
	}
}

// giveBlock gives the buffer of m, delivered by readRejoinInto, back to
// bufs, if m is a Block: its receiver must read nothing of it afterwards.
func giveBlock(bufs freeBufs, m wire.Message) {
	if b, ok := m.(*wire.Block); ok {
		bufs.give(b.Tuples)
	}
}
