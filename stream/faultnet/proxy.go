package faultnet

import (
	"context"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP relay on loopback in front of one server (etcd, a node's
// listen address), so a test can cut a single client or peer off without
// touching the server. It relays bytes as they come, so TLS passes
// through it untouched. Freeze holds every byte in both directions
// (packets vanish, connections stay open, as in a partition or a stalled
// process), Thaw lets them through again; Reset has the kernel reset
// every connection, as a middlebox or a peer's restarted stack does.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	gate   chan struct{} // closed while traffic flows
	conns  map[net.Conn]struct{}
	closed chan struct{}
	// refuseUntil: connections accepted before it are reset at once.
	refuseUntil time.Time
	wg          sync.WaitGroup
}

// dialTimeout bounds the dial to the target: on loopback it answers at
// once or is down, and an accept loop stuck on it would stall every
// later client.
const dialTimeout = 5 * time.Second

// Start relays connections from a new loopback port to target. Close
// stops it.
func Start(target string) (*Proxy, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, gate: make(chan struct{}), conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
	close(p.gate)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Endpoint is the URL to give the client instead of etcd's.
func (p *Proxy) Endpoint() string { return "http://" + p.Addr() }

// Addr is the proxy's host:port, to dial (or advertise) instead of the
// target's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Freeze holds every byte from now on.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already frozen
	}
}

// Thaw lets traffic through again.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// Reset closes every relayed connection on both sides with SO_LINGER 0,
// so the kernel sends an RST and each end's next read or write fails with
// ECONNRESET (or EPIPE), whatever was in flight. For refuse from now on,
// each new connection is accepted and reset the same way (its dial
// succeeds, its first read fails), as a peer whose stack resets every
// connection for a while; then relaying resumes. Reset returns at once;
// a second call moves the window's end to its own.
func (p *Proxy) Reset(refuse time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuseUntil = time.Now().Add(refuse)
	// Every linger first: closing one side ends its relays, which close
	// the other side, with a FIN unless its linger is set already.
	for c := range p.conns {
		noLinger(c)
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// noLinger makes c's Close send an RST instead of a FIN.
func noLinger(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		// SetLinger only fails on a closed socket, which needs no reset.
		_ = tc.SetLinger(0)
	}
}

// reset closes c with an RST.
func reset(c net.Conn) {
	noLinger(c)
	c.Close()
}

// refusingLocked reports whether a connection accepted now is to be reset;
// p.mu held.
func (p *Proxy) refusingLocked() bool { return time.Now().Before(p.refuseUntil) }

func (p *Proxy) currentGate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gate
}

// Close stops accepting, closes every connection and waits for every relay
// goroutine.
func (p *Proxy) Close() {
	p.mu.Lock()
	select {
	case <-p.closed:
		p.mu.Unlock()
		return
	default:
	}
	close(p.closed)
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// track registers a relayed pair so Close and Reset reach it; false (both
// closed) if the proxy closed or a reset window opened since the accept:
// a pair added after Reset swept the others would outlive it.
func (p *Proxy) track(in, out net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		in.Close()
		out.Close()
		return false
	default:
	}
	if p.refusingLocked() {
		noLinger(in)
		noLinger(out)
		in.Close()
		out.Close()
		return false
	}
	p.conns[in] = struct{}{}
	p.conns[out] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		refuse := p.refusingLocked()
		p.mu.Unlock()
		if refuse {
			// Not dialled through: the target sees nothing of it, as
			// behind a link that resets.
			reset(in)
			continue
		}
		d := net.Dialer{Timeout: dialTimeout}
		out, err := d.DialContext(context.Background(), "tcp", p.target)
		if err != nil {
			in.Close()
			continue // the target is down: the client sees a closed connection
		}
		if !p.track(in, out) {
			continue
		}
		p.wg.Add(2)
		go p.relay(out, in)
		go p.relay(in, out)
	}
}

// relay copies src to dst one read at a time, holding each read while the
// proxy is frozen. Either side ending ends both.
func (p *Proxy) relay(dst, src net.Conn) {
	defer p.wg.Done()
	defer p.untrack(dst)
	defer p.untrack(src)
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case <-p.currentGate():
			case <-p.closed:
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or closed: either way this direction is over
		}
	}
}
