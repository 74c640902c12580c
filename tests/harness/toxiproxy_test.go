package harness

import (
	"bufio"
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
