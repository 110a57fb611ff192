package node

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// peer is who dialled an accepted connection, as its certificate says;
// nil on an insecure node, where anyone may say anything.
type peer = *certs.Identity

// handshake runs the TLS handshake of an accepted connection (under the
// hello deadline the helloConn set) and returns the dialler's verified
// identity; nil, nil on an insecure node. A failed handshake is logged
// here; the dialler has its TLS alert.
func (n *Node) handshake(tc *tls.Conn, from net.Addr) (peer, error) {
	if tc == nil {
		return nil, nil
	}
	if err := tc.HandshakeContext(n.ctx); err != nil {
		if errors.Is(err, net.ErrClosed) {
			return nil, err // closed here: for a newer connection, or the node stops
		}
		n.metrics.tlsRefused.Inc()
		n.limited.Log(slog.LevelWarn, refusalKey("tls-refused", err), "connection refused: TLS handshake failed", "from", from, "err", err)
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) && rh.Conn != nil {
			n.refusePlain(rh.Conn)
		}
		return nil, err
	}
	id, err := certs.PeerOf(tc.ConnectionState())
	if err != nil {
		return nil, err // the server config's VerifyConnection already checked it
	}
	return &id, nil
}

// refusePlain answers a dialler that spoke plain TCP to this TLS port
// with a Reply it can read, as its hello's answer, so that its error says
// what to do rather than that the connection broke. It is bounded by the
// hello deadline already set on nc; the caller closes nc.
func (n *Node) refusePlain(nc net.Conn) {
	c := stream.NewConn(nc, stream.Config{Codec: wire.CodecNone})
	text := fmt.Sprintf("node %s serves mutual TLS only: dial it with a certificate of the cluster's CA (rejoin cert), or run the nodes with --insecure", n.id)
	if err := c.Send(n.ctx, &wire.Reply{Err: text}); err != nil {
		return
	}
	if err := c.CloseWrite(); err != nil {
		return
	}
	// A close with the dialler's hello unread would reset the connection
	// and could lose the reply.
	_, _ = io.Copy(io.Discard, io.LimitReader(nc, refuseDrainBytesMax))
}

// authorize checks a hello against the certificate of the connection it
// came on: a client certificate may only call procedures; node n<N>'s
// may open a feed only as initiator N, and rejoin and repair streams
// only as n<N>. What it may not do never reaches a replica. A rejoin
// that passes is then checked against the task's claim (checkHolder),
// which must be held by that same node: the coordinator authorises the
// stream, the certificate says who opened it.
func authorize(p peer, h *wire.Hello) error {
	if p == nil {
		return nil
	}
	if h.Kind == wire.HelloClient {
		if p.Role != certs.RoleClient {
			return fmt.Errorf("%w: %s may not open a client connection: calls need a client certificate", certs.ErrPeer, p)
		}
		return nil
	}
	if p.Role != certs.RoleNode {
		return fmt.Errorf("%w: %s may only call procedures, not open a %v stream", certs.ErrPeer, p, h.Kind)
	}
	if h.Node != p.Name {
		return fmt.Errorf("%w: %v hello says node %q, but the certificate is %s", certs.ErrPeer, h.Kind, h.Node, p)
	}
	if h.Kind == wire.HelloFeed {
		if num, _ := p.NodeNumber(); int(h.Initiator) != num {
			return fmt.Errorf("%w: feed hello for initiator %d, but the certificate is %s (initiator %d)", certs.ErrPeer, h.Initiator, p, num)
		}
	}
	return nil
}

// dialConfig is the stream config with which this node dials node want:
// the server's certificate must be want's.
func (n *Node) dialConfig(want string) stream.Config {
	cfg := n.streamConfig()
	if n.cfg.TLS != nil {
		cfg.TLS = n.cfg.TLS.DialConfig(want)
	}
	return cfg
}

// refusalKey is the limitedLog key of a refusal: one per reason, so a
// storm of one kind does not hide another.
func refusalKey(kind string, err error) string {
	const reasonBytesMax = 160 // bounds the key; the limiter bounds the keys
	r := err.Error()
	if len(r) > reasonBytesMax {
		r = r[:reasonBytesMax]
	}
	return kind + "/" + r
}
