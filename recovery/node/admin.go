package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/netutil"

	"github.com/rejoin-db/rejoin/recovery/node/certs"
)

// The admin HTTP's bounds (docs/DESIGN.md "Who may talk to a node"): it
// answers people and scrapers, a few at a time, so a small cap; a
// connection over it waits in the listen queue and takes no descriptor
// of the process, whose accept loop needs them.
const (
	adminConnsMax          = 64
	adminReadHeaderTimeout = 5 * time.Second
	adminIdleTimeout       = 60 * time.Second
	// adminReadTimeout bounds a request as read; no write timeout, since
	// a CPU profile or a trace streams for as long as it was asked.
	adminReadTimeout    = 30 * time.Second
	adminHeaderBytesMax = 64 << 10
)

// adminServer is the admin HTTP server on hln, bounded: at most
// adminConnsMax connections (netutil.LimitListener), each with a
// read-header, read and idle timeout. On a secure node hln is TLS off
// loopback; on loopback it takes TLS and plain HTTP both on one port
// (sniffListener): plain for /status and /metrics, as before, TLS for
// what needs the admin's certificate.
func (n *Node) adminServer(hln net.Listener, offLoopback bool) (*http.Server, net.Listener) {
	connsMax, header, idle := adminConnsMax, adminReadHeaderTimeout, adminIdleTimeout
	if k := n.cfg.knobs.adminConnsMax; k > 0 {
		connsMax = k
	}
	if k := n.cfg.knobs.adminTimeout; k > 0 {
		header, idle = k, k
	}
	hln = netutil.LimitListener(hln, connsMax)
	switch {
	case n.serverTLS != nil && offLoopback:
		hln = tls.NewListener(hln, n.cfg.TLS.ServerConfig())
	case n.serverTLS != nil:
		hln = sniffListener{Listener: hln, cfg: n.cfg.TLS.ServerConfig()}
	}
	srv := &http.Server{Handler: n.httpHandler(), ReadHeaderTimeout: header, ReadTimeout: adminReadTimeout, IdleTimeout: idle,
		MaxHeaderBytes: adminHeaderBytesMax,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, adminConnKey{}, c)
		}}
	return srv, hln
}

// adminOnly serves h to the admin identity (certs.AdminName) alone: a
// client certificate of the cluster's CA naming it, over TLS, on
// loopback too, since any local user reaches loopback. An insecure node
// has no certificates to ask for: there anyone may do anything, as it
// says when it starts.
func (n *Node) adminOnly(h http.HandlerFunc) http.HandlerFunc {
	if n.serverTLS == nil {
		return h
	}
	admin := certs.ClientID(certs.AdminName)
	return func(w http.ResponseWriter, req *http.Request) {
		id, ok := adminPeer(req)
		if !ok || !id.IsAdmin() {
			who := "no certificate"
			if ok {
				who = id.String()
			}
			n.limited.Log(slog.LevelWarn, "admin-refused", "admin endpoint refused: not the admin identity", "path", req.URL.Path, "from", req.RemoteAddr, "peer", who)
			http.Error(w, fmt.Sprintf("%s needs a client certificate of the admin identity %s over https (rejoin cert create-client %s); got %s",
				req.URL.Path, admin, certs.AdminName, who), http.StatusForbidden)
			return
		}
		h(w, req)
	}
}

// adminPeer is the verified identity of an admin HTTP request's dialler.
func adminPeer(req *http.Request) (certs.Identity, bool) {
	cs := req.TLS
	if cs == nil {
		if sc, ok := req.Context().Value(adminConnKey{}).(*sniffConn); ok {
			cs = sc.state()
		}
	}
	if cs == nil {
		return certs.Identity{}, false
	}
	id, err := certs.PeerOf(*cs)
	return id, err == nil
}

type adminConnKey struct{}

// sniffListener serves TLS and plain connections on one port, told
// apart by their first byte (a TLS handshake record's is 0x16; an HTTP
// request's a letter of its method). It tells on the connection's own
// goroutine, at its first read, so a silent dialler holds up no Accept.
type sniffListener struct {
	net.Listener
	cfg *tls.Config
}

func (l sniffListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &sniffConn{Conn: nc, cfg: l.cfg}, nil
}

// tlsHandshakeRecord is the first byte of a TLS connection.
const tlsHandshakeRecord = 0x16

// sniffConn is a connection of a sniffListener: TLS or plain, known at
// its first read (http.Server reads before it writes). Deadlines go to
// the TCP connection, as a tls.Conn's do.
type sniffConn struct {
	net.Conn
	cfg *tls.Config

	once sync.Once
	err  error    // of the first byte's read
	r    net.Conn // what to read and write: plain, or the TLS connection
	tc   atomic.Pointer[tls.Conn]
}

func (c *sniffConn) sniff() error {
	c.once.Do(func() {
		var b [1]byte
		if _, err := io.ReadFull(c.Conn, b[:]); err != nil {
			c.err = err
			return
		}
		pc := &prefixConn{Conn: c.Conn, head: b[:]}
		if b[0] != tlsHandshakeRecord {
			c.r = pc
			return
		}
		tc := tls.Server(pc, c.cfg)
		c.tc.Store(tc)
		c.r = tc
	})
	return c.err
}

func (c *sniffConn) Read(p []byte) (int, error) {
	if err := c.sniff(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func (c *sniffConn) Write(p []byte) (int, error) {
	if err := c.sniff(); err != nil {
		return 0, err
	}
	return c.r.Write(p)
}

func (c *sniffConn) Close() error {
	if tc := c.tc.Load(); tc != nil {
		return tc.Close()
	}
	return c.Conn.Close()
}

// state is the TLS state once the handshake is done; nil on a plain
// connection.
func (c *sniffConn) state() *tls.ConnectionState {
	tc := c.tc.Load()
	if tc == nil {
		return nil
	}
	cs := tc.ConnectionState()
	if !cs.HandshakeComplete {
		return nil
	}
	return &cs
}

// prefixConn reads head before the rest of its connection.
type prefixConn struct {
	net.Conn
	head []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
