package sender

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// instantConn is a connection whose server PUBACKs every publish at once
// and announces receiveMax as its Receive Maximum.
type instantConn struct {
	receiveMax uint16
	lost       chan struct{}
}

func (c *instantConn) Gen() uint64                                        { return 1 }
func (c *instantConn) SessionPresent() bool                               { return false }
func (c *instantConn) Lost() <-chan struct{}                              { return c.lost }
func (c *instantConn) Context() context.Context                           { return mqttclient.LostContext(c.lost) }
func (c *instantConn) Alive() bool                                        { return true }
func (c *instantConn) Drop(error)                                         {}
func (c *instantConn) Publish(context.Context, mqttmsg.Publication) error { return nil }
func (c *instantConn) PublishAsync(mqttmsg.Publication) Token             { return doneToken{} }
func (c *instantConn) Subscribe(context.Context, map[string]byte) error   { return nil }
func (c *instantConn) Limits() mqttclient.ServerLimits {
	l := mqttclient.NoLimits
	l.ReceiveMaximum = c.receiveMax
	return l
}

type oneConn struct{ c mqttclient.Conn }

func (t oneConn) WaitReady(context.Context) (mqttclient.Conn, error) { return t.c, nil }
func (t oneConn) Current() mqttclient.Conn                           { return t.c }
func (t oneConn) Close(context.Context) error                        { return nil }

type windowMetrics struct {
	testMetrics
	mu        sync.Mutex
	windows   []int
	confirmed int
}

func (m *windowMetrics) SetWindow(n int) {
	m.mu.Lock()
	m.windows = append(m.windows, n)
	m.mu.Unlock()
}
func (m *windowMetrics) OnConfirmed(time.Duration) {
	m.mu.Lock()
	m.confirmed++
	m.mu.Unlock()
}

type lockedLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lockedLog) add(s string)              { l.mu.Lock(); l.lines = append(l.lines, s); l.mu.Unlock() }
func (l *lockedLog) Infof(f string, a ...any)  { l.add("INFO " + fmt.Sprintf(f, a...)) }
func (l *lockedLog) Warnf(f string, a ...any)  { l.add("WARN " + fmt.Sprintf(f, a...)) }
func (l *lockedLog) Errorf(f string, a ...any) { l.add("ERROR " + fmt.Sprintf(f, a...)) }

// A server Receive Maximum of 2 holds a broker-confirmed window of 64 at 2:
// the gauge says 2, and the log says so once for the connection, naming
// the broker setting that lifts it.
func TestSessionReportsTheWindowAndLogsAServerLimitOnce(t *testing.T) {
	ob := openOutbox(t, 50)
	m := &windowMetrics{testMetrics: testMetrics{ignored: map[string]int{}, codes: map[byte]int{}}}
	log := &lockedLog{}
	conn := &instantConn{receiveMax: 2, lost: make(chan struct{})}
	sd := New(Config{Window: 64, PublishTimeout: time.Minute, Retry: backoff.Backoff{Initial: time.Millisecond, Max: time.Millisecond}},
		ob, oneConn{conn}, NewAckQueue(), NewIgnoredACKs(m, log), m, log)
	ctx, cancel := context.WithCancel(context.Background())
	go sd.Run(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		m.mu.Lock()
		done := m.confirmed >= 50
		m.mu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := sd.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m.confirmed != 50 {
		t.Fatalf("%d of 50 confirmed", m.confirmed)
	}
	if len(m.windows) == 0 || m.windows[0] != 2 {
		t.Fatalf("window gauge %v, want 2 (the Receive Maximum) first", m.windows)
	}
	held := 0
	for _, l := range log.lines {
		if strings.Contains(l, "Receive Maximum of 2") {
			held++
			if !strings.Contains(l, "max_inflight_messages") {
				t.Errorf("the log line does not name the broker setting: %q", l)
			}
		}
	}
	if held != 1 {
		t.Fatalf("%d lines about the Receive Maximum, want 1 per connection: %q", held, log.lines)
	}
}

// silentConn is an instantConn whose server never PUBACKs.
type silentConn struct{ instantConn }

func (c *silentConn) PublishAsync(mqttmsg.Publication) Token {
	return &testToken{done: make(chan struct{})}
}

// A packed session against a Receive Maximum of 20 keeps at least 20 full
// frames in flight; a session after one that confirmed nothing keeps 64
// records, so a floor too big for a slow link cannot time out every
// session.
func TestAPackedSessionFallsBackToTheUnpackedFloorAfterOneThatConfirmedNothing(t *testing.T) {
	ob := openOutbox(t, 0)
	appendIngress(t, ob, 1, 200)
	m := &windowMetrics{testMetrics: testMetrics{ignored: map[string]int{}, codes: map[byte]int{}}}
	first := &silentConn{instantConn{receiveMax: 20, lost: make(chan struct{})}}
	second := &silentConn{instantConn{receiveMax: 20, lost: make(chan struct{})}}
	q := connQueue{conns: make(chan mqttclient.Conn, 2)}
	q.conns <- first
	cfg := Config{Window: DefaultWindow, PublishTimeout: time.Minute, Confirm: ByAck("acks", time.Minute, nil),
		Retry: backoff.Backoff{Initial: time.Millisecond, Max: time.Millisecond}, Encoding: e2eEncoding,
		Pack: Pack{MaxEvents: 64, MaxBytes: 1 << 16, Compression: frame.Zstd}}
	sd := New(cfg, ob, q, NewAckQueue(), NewIgnoredACKs(m, &lockedLog{}), m, &lockedLog{})
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); _ = sd.Wait(context.Background()) }()
	go sd.Run(ctx)
	windows := func() []int { m.mu.Lock(); defer m.mu.Unlock(); return slices.Clone(m.windows) }
	eventually(t, "the first session's window", func() bool { return len(windows()) == 1 })
	q.conns <- second
	close(first.lost)
	eventually(t, "the second session's window", func() bool { return len(windows()) == 2 })
	if w := windows(); w[0] != 20*64 || w[1] != initialWindow {
		t.Fatalf("windows %v, want %d (20 frames of 64) and then %d", w, 20*64, initialWindow)
	}
}
