package mqttclient

import (
	"bufio"
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"os"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"golang.org/x/net/proxy"
)

// bufConnMax bounds what a bufConn holds: Write waits while this much is
// handed over and not yet written (one larger packet is taken alone).
const bufConnMax = 256 << 10

// bufConnCloseFlush bounds how long Close lets buffered packets (a
// DISCONNECT) leave before it closes the connection.
const bufConnCloseFlush = time.Second

// bufConnReadBuf is the read buffer: paho reads a packet's header a byte
// at a time, each a read(2) without it.
const bufConnReadBuf = 16 << 10

// bufConn coalesces reads and writes. paho reads each packet in several
// small reads (the fixed header byte by byte), straight from the socket:
// here they come from a bufio.Reader, one read(2) for everything that has
// arrived. paho writes every packet with its own Write, so
// a window of 64 publishes costs 64 write(2) calls. Here Write copies the
// packet into a buffer and returns; one flusher goroutine writes everything
// buffered with a single Write on the wrapped connection. Packets handed
// over while that write is in progress leave together in the next one, and
// the flusher starts as soon as the writer goes idle: nothing waits for a
// timer. Addresses and deadlines are the wrapped connection's.
//
// A write error is returned by every later Write; data handed over before
// it is lost with the connection, as it would be in the kernel's buffer.
// MQTT's own acknowledgements (PUBACK, ACK) are what confirm a message, not
// a Write returning nil.
type bufConn struct {
	net.Conn
	r *bufio.Reader // paho reads from one goroutine

	mu      sync.Mutex
	buf     []byte // handed over, not yet written
	err     error  // the first write error
	closing bool
	flushed chan struct{} // closed and replaced after each write: space for a waiting Write

	wake      chan struct{} // capacity 1: buf has data, or closing
	done      chan struct{} // closed when the flusher returns
	closeOnce sync.Once
	closeErr  error
}

// newBufConn wraps conn and starts its flusher; Close stops it.
func newBufConn(conn net.Conn) *bufConn {
	b := &bufConn{
		Conn:    conn,
		r:       bufio.NewReaderSize(conn, bufConnReadBuf),
		flushed: make(chan struct{}),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	go b.flushLoop()
	return b
}

// Read returns what has arrived, reading the socket only when the buffer
// is empty.
func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// Write hands p to the flusher. It blocks only while bufConnMax bytes wait.
func (b *bufConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	for b.err == nil && !b.closing && len(b.buf) > 0 && len(b.buf)+len(p) > bufConnMax {
		space := b.flushed
		b.mu.Unlock()
		<-space
		b.mu.Lock()
	}
	switch {
	case b.err != nil:
		err := b.err
		b.mu.Unlock()
		return 0, err
	case b.closing:
		b.mu.Unlock()
		return 0, net.ErrClosed
	}
	wasEmpty := len(b.buf) == 0
	b.buf = append(b.buf, p...)
	b.mu.Unlock()
	if wasEmpty {
		wake(b.wake)
	}
	return len(p), nil
}

// wake sends a wake-up on ch, a channel of capacity 1, unless one is
// already pending.
func wake(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// flushLoop writes what is buffered until Close, or until a write fails.
func (b *bufConn) flushLoop() {
	defer close(b.done)
	var spare []byte
	for {
		b.mu.Lock()
		if len(b.buf) == 0 {
			stop := b.closing
			b.mu.Unlock()
			if stop {
				return
			}
			<-b.wake
			continue
		}
		out := b.buf
		b.buf, spare = spare[:0], nil // spare is now the writers' buffer
		b.mu.Unlock()

		_, err := b.Conn.Write(out)

		b.mu.Lock()
		if err != nil {
			b.err, b.buf = err, nil
		}
		close(b.flushed)
		b.flushed = make(chan struct{})
		b.mu.Unlock()
		if err != nil {
			return
		}
		if cap(out) <= bufConnMax {
			spare = out // keep one buffer of the usual size, not a huge one
		}
	}
}

// Close lets what was handed over leave (bounded by bufConnCloseFlush),
// then closes the wrapped connection.
func (b *bufConn) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closing = true
		close(b.flushed) // wake a Write waiting for space: it sees closing
		b.flushed = make(chan struct{})
		b.mu.Unlock()
		wake(b.wake)
		_ = b.Conn.SetWriteDeadline(time.Now().Add(bufConnCloseFlush))
		<-b.done
		b.closeErr = b.Conn.Close()
	})
	return b.closeErr
}

// openBuffered is paho's CustomOpenConnectionFn: it opens the connection
// for each scheme the way paho does (proxy from the environment for TCP,
// TLS with the configured tls.Config, paho's websocket dialer) and wraps it
// in a bufConn.
func openBuffered(uri *url.URL, o paho.ClientOptions) (net.Conn, error) {
	conn, err := dial(uri, o)
	if err != nil {
		return nil, err
	}
	return newBufConn(conn), nil
}

func dial(uri *url.URL, o paho.ClientOptions) (net.Conn, error) {
	d := o.Dialer
	if d == nil {
		d = &net.Dialer{Timeout: o.ConnectTimeout}
	}
	switch uri.Scheme {
	case "tcp", "mqtt":
		return proxy.FromEnvironmentUsing(d).Dial("tcp", uri.Host)
	case "ssl", "tls", "mqtts", "mqtt+ssl", "tcps":
		if os.Getenv("all_proxy") == "" {
			return tls.DialWithDialer(d, "tcp", uri.Host, o.TLSConfig)
		}
		conn, err := proxy.FromEnvironment().Dial("tcp", uri.Host)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(conn, o.TLSConfig)
		if err := tc.Handshake(); err != nil {
			_ = conn.Close()
			return nil, err
		}
		return tc, nil
	case "ws", "wss":
		u := *uri
		u.User = nil // the websocket dialer refuses URLs with user info
		tlsc := o.TLSConfig
		if uri.Scheme == "ws" {
			tlsc = nil
		}
		return paho.NewWebsocket(u.String(), tlsc, o.ConnectTimeout, o.HTTPHeaders, o.WebsocketOptions)
	}
	return nil, errors.New("unknown protocol " + uri.Scheme)
}
