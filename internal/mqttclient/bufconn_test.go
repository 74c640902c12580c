package mqttclient

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case server = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("accept timed out")
	}
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// gatedConn counts the writes that reach the connection; the first one
// waits until gate is closed, and fail makes every write fail.
type gatedConn struct {
	net.Conn
	gate   chan struct{}
	writes atomic.Int64
	fail   atomic.Bool
}

func (g *gatedConn) Write(p []byte) (int, error) {
	if g.writes.Add(1) == 1 {
		<-g.gate
	}
	if g.fail.Load() {
		return 0, errors.New("injected write failure")
	}
	return g.Conn.Write(p)
}

// waitFirstWrite waits until the flusher is inside g's first (held) write.
func waitFirstWrite(t *testing.T, g *gatedConn) {
	t.Helper()
	for i := 0; g.writes.Load() == 0; i++ {
		if i > 3000 {
			t.Fatal("the flusher did not start writing")
		}
		time.Sleep(time.Millisecond)
	}
}

// readAllAsync collects what server receives until EOF.
func readAllAsync(server net.Conn) <-chan []byte {
	out := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(server)
		out <- b
	}()
	return out
}

func recv(t *testing.T, ch <-chan []byte) []byte {
	t.Helper()
	select {
	case b := <-ch:
		return b
	case <-time.After(30 * time.Second):
		t.Fatal("the peer did not see the connection close")
		return nil
	}
}

// TestBufConnCoalescesPacketsWrittenDuringAWrite: while one write to the
// socket is in progress, the packets handed over meanwhile leave together
// in the next write, in order and complete.
func TestBufConnCoalescesPacketsWrittenDuringAWrite(t *testing.T) {
	client, server := tcpPair(t)
	g := &gatedConn{Conn: client, gate: make(chan struct{})}
	b := newBufConn(g)
	got := readAllAsync(server)

	var want bytes.Buffer
	for i := 0; i < 100; i++ {
		p := bytes.Repeat([]byte{byte(i)}, 1+i%7)
		want.Write(p)
		if n, err := b.Write(p); n != len(p) || err != nil {
			t.Fatalf("Write %d: %d, %v", i, n, err)
		}
		if i == 0 {
			waitFirstWrite(t, g)
		}
	}
	close(g.gate) // the first packet's write was held; 99 packets wait behind it
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if data := recv(t, got); !bytes.Equal(data, want.Bytes()) {
		t.Fatalf("peer received %d bytes, want the %d written, in order", len(data), want.Len())
	}
	if n := g.writes.Load(); n != 2 {
		t.Fatalf("100 packets took %d writes to the socket, want 2 (the held one, then the other 99 at once)", n)
	}
}

// TestBufConnCloseDeliversWhatWasWritten: a packet written just before
// Close (paho's DISCONNECT) reaches the peer.
func TestBufConnCloseDeliversWhatWasWritten(t *testing.T) {
	client, server := tcpPair(t)
	b := newBufConn(client)
	got := readAllAsync(server)
	if _, err := b.Write([]byte{0xe0, 0x00}); err != nil { // DISCONNECT
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if data := recv(t, got); !bytes.Equal(data, []byte{0xe0, 0x00}) {
		t.Fatalf("peer received %x, want e000", data)
	}
	if _, err := b.Write([]byte{1}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v, want net.ErrClosed", err)
	}
}

// TestBufConnWriteErrorReachesTheWriter: once a write to the socket fails,
// Write returns that error instead of accepting packets that cannot leave.
func TestBufConnWriteErrorReachesTheWriter(t *testing.T) {
	client, _ := tcpPair(t)
	g := &gatedConn{Conn: client, gate: make(chan struct{})}
	g.fail.Store(true)
	close(g.gate)
	b := newBufConn(g)
	defer b.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := b.Write([]byte("publish"))
		if err != nil {
			if err.Error() != "injected write failure" {
				t.Fatalf("Write returned %v, want the socket's error", err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("Write kept succeeding after the socket failed")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBufConnBoundsWhatItHolds: while the socket does not take data, Write
// accepts up to bufConnMax bytes and then waits; it goes on once the socket
// takes data again.
func TestBufConnBoundsWhatItHolds(t *testing.T) {
	client, server := tcpPair(t)
	g := &gatedConn{Conn: client, gate: make(chan struct{})}
	b := newBufConn(g)
	got := readAllAsync(server)

	chunk := make([]byte, 1024)
	const chunks = 2 * bufConnMax / 1024
	if _, err := b.Write(chunk); err != nil {
		t.Fatal(err)
	}
	waitFirstWrite(t, g)
	var written atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; i < chunks; i++ {
			if _, err := b.Write(chunk); err != nil {
				t.Errorf("Write %d: %v", i, err)
				return
			}
			written.Add(1024)
		}
	}()
	// The first chunk is held in the gated write; the writer stops once
	// bufConnMax more are buffered.
	for i := 0; i < 1000 && written.Load() < bufConnMax; i++ {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if w := written.Load(); w > bufConnMax {
		t.Fatalf("Write accepted %d bytes while the socket took none, bound is %d", w, bufConnMax)
	}
	close(g.gate)
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if data := recv(t, got); len(data) != chunks*1024 {
		t.Fatalf("peer received %d bytes, want %d", len(data), chunks*1024)
	}
}

// TestBufConnCloseIsBoundedWhenThePeerStopsReading: Close gives buffered
// data bufConnCloseFlush to leave, then closes anyway.
func TestBufConnCloseIsBoundedWhenThePeerStopsReading(t *testing.T) {
	client, _ := tcpPair(t) // the server end never reads
	b := newBufConn(client)
	chunk := make([]byte, 64<<10)
	for i := 0; i < 200; i++ { // up to 12.5 MiB: more than the socket buffers hold
		done := make(chan error, 1)
		go func() { _, err := b.Write(chunk); done <- err }()
		select {
		case <-done:
			continue
		case <-time.After(500 * time.Millisecond):
			// Write is waiting for space: the socket is full.
		}
		break
	}
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case <-closed:
	case <-time.After(bufConnCloseFlush + 10*time.Second):
		t.Fatal("Close did not return while the peer was not reading")
	}
}

// countingConn counts the reads that reach the connection.
type countingConn struct {
	net.Conn
	reads atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

// TestBufConnReadsWhatArrivedInOneSyscall: paho reads a packet header a
// byte at a time; bytes that arrived together are read from the socket
// once, and come out complete and in order.
func TestBufConnReadsWhatArrivedInOneSyscall(t *testing.T) {
	client, server := tcpPair(t)
	c := &countingConn{Conn: client}
	b := newBufConn(c)
	defer b.Close()
	want := make([]byte, 1000)
	for i := range want {
		want[i] = byte(i)
	}
	// On loopback the bytes are in the receiving socket when Write returns.
	if _, err := server.Write(want); err != nil {
		t.Fatal(err)
	}
	if err := b.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(want))
	one := make([]byte, 1)
	for len(got) < len(want) {
		if _, err := io.ReadFull(b, one); err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		got = append(got, one[0])
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes read differ from the bytes sent")
	}
	if n := c.reads.Load(); n != 1 {
		t.Fatalf("1000 one-byte reads took %d reads from the socket, want 1", n)
	}
}
