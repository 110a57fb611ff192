package faultnet

import (
	"context"
	"net"
	"sync"
)

// Proxy is a TCP relay on loopback between one client and etcd, so a test
// can cut a single executor off without touching the server: freeze holds
// every byte in both directions (packets vanish, connections stay open, as
// in a partition or a stalled process), thaw lets them through again.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	gate   chan struct{} // closed while traffic flows
	conns  map[net.Conn]struct{}
	closed chan struct{}
	wg     sync.WaitGroup
}

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
func (p *Proxy) Endpoint() string { return "http://" + p.ln.Addr().String() }

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

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		c.Close()
		return false
	default:
		p.conns[c] = struct{}{}
		return true
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		var d net.Dialer
		out, err := d.DialContext(context.Background(), "tcp", p.target)
		if err != nil {
			in.Close()
			continue // etcd down: the client sees a closed connection
		}
		if !p.track(in) || !p.track(out) {
			in.Close()
			out.Close()
			return
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
