package harness

import (
	"bufio"
	"bytes"
	"net"
	"testing"
	"time"
)

// echoServer answers every line with the same line, on 127.0.0.1.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader, wait time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = c.SetDeadline(start.Add(wait))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	_, err := r.ReadString('\n')
	return time.Since(start), err
}

// A link delays a round trip by twice its latency, drops everything while
// blackholed, and resets its connections with reset_peer.
func TestLinkDelaysBlackholesAndResets(t *testing.T) {
	l := NewLink(t, echoServer(t))
	lat := l.Latency(50*time.Millisecond, 0)
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if d, err := roundTrip(c, r, 10*time.Second); err != nil || d < 100*time.Millisecond {
		t.Fatalf("round trip %s (%v), want at least 100ms through 50ms each way", d, err)
	}
	l.RemoveAll(lat)

	bh := l.Blackhole()
	if _, err := roundTrip(c, r, 500*time.Millisecond); err == nil {
		t.Fatal("a round trip through a blackholed link succeeded")
	}
	l.RemoveAll(bh)

	c2, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	r2 := bufio.NewReader(c2)
	if _, err := roundTrip(c2, r2, 10*time.Second); err != nil {
		t.Fatalf("a new connection after the blackhole: %v", err)
	}
	rs := l.ResetPeer()
	if _, err := roundTrip(c2, r2, 10*time.Second); err == nil {
		t.Fatal("a round trip succeeded through reset_peer")
	}
	l.RemoveAll(rs)
}

// A sliced link delivers the upstream bytes intact and in order, in more
// than one piece: what a receiver must reassemble.
func TestLinkSlicesTheUpstream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		data  []byte
		reads int
		err   error
	}
	const size = 1000
	got := make(chan result, 1)
	go func() {
		var r result
		defer func() { got <- r }()
		c, err := ln.Accept()
		if err != nil {
			r.err = err
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, size)
		for len(r.data) < size && r.err == nil {
			var n int
			n, r.err = c.Read(buf)
			r.data = append(r.data, buf[:n]...)
			if n > 0 {
				r.reads++
			}
		}
	}()
	l := NewLink(t, ln.Addr().String())
	l.Slicer(10, 0, 5*time.Millisecond)
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent := make([]byte, size)
	for i := range sent {
		sent[i] = byte(i)
	}
	if _, err := c.Write(sent); err != nil { // one write: one chunk for the proxy to slice
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || !bytes.Equal(r.data, sent) {
		t.Fatalf("the target read %d of %d bytes intact=%v (%v)", len(r.data), size, bytes.Equal(r.data, sent), r.err)
	}
	if r.reads < 2 {
		t.Fatalf("the target read %d bytes in %d piece(s) through a slicer of 10-byte pieces 5 ms apart", size, r.reads)
	}
	t.Logf("%d bytes arrived in %d reads", size, r.reads)
}
