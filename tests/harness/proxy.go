package harness

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy on 127.0.0.1 in front of one target address. A test
// points a client at it and then cuts or stalls the network path.
//
// States: forwarding (the default), cut (every connection closed, new ones
// closed at once) and stalled (connections stay open, no byte moves in
// either direction). Restore returns to forwarding.
type Proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu      sync.Mutex
	cut     bool
	stalled chan struct{} // non-nil while stalled; Restore closes it
	conns   map[*proxyConn]struct{}
	closed  bool
	wg      sync.WaitGroup

	up, down atomic.Int64 // bytes forwarded to the target, and back
}

// proxyConn is one client connection and its upstream connection.
type proxyConn struct {
	client, upstream net.Conn
	once             sync.Once
	done             chan struct{} // closed by close()
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		close(c.done)
		c.client.Close()
		c.upstream.Close()
	})
}

// dialTimeout bounds the proxy's connect to its target.
const dialTimeout = 5 * time.Second

// NewProxy listens on 127.0.0.1:0 and forwards each connection to target.
// It closes everything at cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("harness: proxy to %s: listen on 127.0.0.1: %v", target, err)
	}
	p := &Proxy{t: t, ln: ln, target: target, conns: make(map[*proxyConn]struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.close)
	return p
}

// Addr is host:port of the proxy's listener.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL is the proxy's address as an MQTT broker URL.
func (p *Proxy) URL() string { return "tcp://" + p.Addr() }

// Cut closes every open connection and closes new ones as soon as they are
// accepted, until Restore: a network outage that clients notice at once.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.close()
	}
}

// Stall stops forwarding bytes in both directions while keeping every
// connection open (new ones too), until Restore: a black hole that clients
// notice only through their own timeouts. At most one read buffer per
// direction is held; beyond it TCP flow control pushes back on the sender.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Restore forwards normally again. Bytes held during a stall are delivered;
// connections closed by Cut stay closed.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// Bytes are the bytes forwarded so far: up from the clients to the
// target, down from the target to the clients (a link's metered traffic).
func (p *Proxy) Bytes() (up, down int64) { return p.up.Load(), p.down.Load() }

// Conns is the number of connections open through the proxy now.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary failures (e.g. out of file descriptors): retry
			// without spinning.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		p.mu.Unlock()
		if refuse {
			client.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	upstream, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		client.Close() // the client sees what it would see from a dead broker
		return
	}
	c := &proxyConn{client: client, upstream: upstream, done: make(chan struct{})}
	p.mu.Lock()
	if p.cut || p.closed { // cut while dialling
		p.mu.Unlock()
		c.close()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()

	var pipes sync.WaitGroup
	pipes.Add(2)
	go func() { defer pipes.Done(); p.pipe(c, client, upstream, &p.up) }()
	go func() { defer pipes.Done(); p.pipe(c, upstream, client, &p.down) }()
	pipes.Wait()

	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// pipe copies src to dst until either side fails, then closes both: MQTT
// never half-closes, so one direction ending ends the connection.
func (p *Proxy) pipe(c *proxyConn, src, dst net.Conn, count *atomic.Int64) {
	defer c.close()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitWhileStalled(c) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			count.Add(int64(n))
		}
		if err != nil {
			return
		}
	}
}

// waitWhileStalled blocks while the proxy is stalled. It returns false if
// the connection was closed meanwhile (by Cut or cleanup).
func (p *Proxy) waitWhileStalled(c *proxyConn) bool {
	for {
		p.mu.Lock()
		gate := p.stalled
		p.mu.Unlock()
		if gate == nil {
			return true
		}
		select {
		case <-gate:
			// Restored, but another Stall may already have begun: look again.
		case <-c.done:
			return false
		}
	}
}

// close stops the listener and every connection and waits for the
// goroutines to finish.
func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
