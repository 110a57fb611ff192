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
			c.Tuples = append([]byte(nil), b.Tuples...)
			m = &c
		}
		deliver(m)
	}
}
