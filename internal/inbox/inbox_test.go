package inbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// The inbox's collaborators, played by the test: a connection the test can
// lose, messages that record their acks, and counters it can read. What is
// under test, the inbox, is the real one.

type testConn struct {
	lost       chan struct{}
	once       sync.Once
	mu         sync.Mutex
	dropErr    error
	acked      []uint16 // packet IDs in the order their PUBACK/PUBREC left
	published  []mqttmsg.Publication
	publishErr error     // what Publish returns
	events     *[]string // when set, PUBACKs and publishes are recorded here in order
}

func newConn() *testConn { return &testConn{lost: make(chan struct{})} }

func (c *testConn) Alive() bool {
	select {
	case <-c.lost:
		return false
	default:
		return true
	}
}
func (c *testConn) Lost() <-chan struct{}    { return c.lost }
func (c *testConn) Context() context.Context { return mqttclient.LostContext(c.lost) }
func (c *testConn) Drop(err error) {
	c.mu.Lock()
	c.dropErr = err
	c.mu.Unlock()
	c.lose()
}

func (c *testConn) Publish(_ context.Context, p mqttmsg.Publication) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.published = append(c.published, p)
	if c.events != nil {
		*c.events = append(*c.events, "publish "+p.Topic+" "+string(p.Payload))
	}
	return c.publishErr
}

func (c *testConn) lose() { c.once.Do(func() { close(c.lost) }) }

func (c *testConn) ackedIDs() []uint16 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.acked)
}

type testMsg struct {
	conn     *testConn
	topic    string
	qos      byte
	id       uint16
	dup      bool
	payload  []byte // nil: "<topic>#<id>"
	retained bool
}

func (m *testMsg) Topic() string     { return m.topic }
func (m *testMsg) Qos() byte         { return m.qos }
func (m *testMsg) MessageID() uint16 { return m.id }
func (m *testMsg) Duplicate() bool   { return m.dup }
func (m *testMsg) Retained() bool    { return m.retained }
func (m *testMsg) Payload() []byte {
	if m.payload != nil {
		return m.payload
	}
	return []byte(fmt.Sprintf("%s#%d", m.topic, m.id))
}
func (m *testMsg) Properties() *mqttmsg.Properties { return nil }
func (m *testMsg) Ack() {
	m.conn.mu.Lock()
	m.conn.acked = append(m.conn.acked, m.id)
	if m.conn.events != nil {
		*m.conn.events = append(*m.conn.events, fmt.Sprintf("puback %d", m.id))
	}
	m.conn.mu.Unlock()
}

type count struct{ n atomic.Int64 }

func (c *count) Incr(n int64, _ ...string) { c.n.Add(n) }
func (c *count) Set(n int64, _ ...string)  { c.n.Store(n) }
func (c *count) get() int64                { return c.n.Load() }

type testMetrics struct {
	received, acked, retried, duplicates, unmatched, heldTotal, droppedUnacked, overflows, qos0Dropped, held, buffered, backlog count
	rejected, malformed, acksPublished, ackPublishFails                                                                         count
}

func (tm *testMetrics) metrics() *Metrics {
	return &Metrics{
		Received: &tm.received, Acked: &tm.acked, Retried: &tm.retried, Duplicates: &tm.duplicates,
		Unmatched: &tm.unmatched, HeldTotal: &tm.heldTotal, DroppedUnacked: &tm.droppedUnacked,
		ReplayOverflows: &tm.overflows, QoS0Dropped: &tm.qos0Dropped, Held: &tm.held, Buffered: &tm.buffered, Backlog: &tm.backlog,
		Rejected: &tm.rejected, Malformed: &tm.malformed, AcksPublished: &tm.acksPublished, AckPublishFails: &tm.ackPublishFails,
	}
}

type testLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *testLog) add(level, format string, args ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, level+": "+fmt.Sprintf(format, args...))
	l.mu.Unlock()
}
func (l *testLog) Debugf(f string, a ...any) { l.add("debug", f, a...) }
func (l *testLog) Warnf(f string, a ...any)  { l.add("warn", f, a...) }
func (l *testLog) Errorf(f string, a ...any) { l.add("error", f, a...) }
func (l *testLog) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

type fixture struct {
	t   *testing.T
	in  *Inbox
	m   *testMetrics
	log *testLog
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	if cfg.Topics == nil {
		cfg.Topics = []string{"a/#"}
	}
	subs, err := ParseSubscriptions(cfg.Topics)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Subs = subs
	cfg.ClientID = "c1"
	if cfg.ReceiveBufferSize == 0 {
		cfg.ReceiveBufferSize = 100
	}
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = time.Minute
	}
	if cfg.Retry.Initial == 0 {
		cfg.Retry = backoff.Backoff{Initial: time.Second, Max: 4 * time.Second}
	}
	f := &fixture{t: t, m: &testMetrics{}, log: &testLog{}}
	f.in = New(cfg, f.m.metrics(), f.log)
	t.Cleanup(f.in.Close)
	return f
}

func (f *fixture) send(c *testConn, topic string, qos byte, id uint16, dup bool) {
	f.in.OnMessage(c, &testMsg{conn: c, topic: topic, qos: qos, id: id, dup: dup})
}

// next returns the delivery ready now, failing the test if there is none.
func (f *fixture) next() *Delivery {
	f.t.Helper()
	d, _, _, closed := f.in.Next(time.Now())
	if d == nil || closed {
		f.t.Fatalf("no delivery ready (closed %v)", closed)
	}
	return d
}

func (f *fixture) expectNone(now time.Time) time.Time {
	f.t.Helper()
	d, wake, nextDue, _ := f.in.Next(now)
	if d != nil {
		f.t.Fatalf("unexpected delivery of packet %d on %q", d.Msg.MessageID(), d.Msg.Topic())
	}
	if wake == nil {
		f.t.Fatal("Next returned neither a delivery nor a channel to wait on")
	}
	return nextDue
}

func TestAcksLeaveInReceiveOrder(t *testing.T) {
	f := newFixture(t, Config{CleanSession: true})
	c := newConn()
	for id := uint16(1); id <= 4; id++ {
		f.send(c, "a/x", 1, id, false)
	}
	ds := []*Delivery{f.next(), f.next(), f.next(), f.next()}
	// The pipeline finishes them out of order: 3, 2, 4, 1.
	ds[2].Complete()
	ds[1].Complete()
	ds[3].Complete()
	if got := c.ackedIDs(); len(got) != 0 {
		t.Fatalf("acked %v before packet 1 was done, want nothing", got)
	}
	ds[0].Complete()
	if got, want := c.ackedIDs(), []uint16{1, 2, 3, 4}; !slices.Equal(got, want) {
		t.Fatalf("acks left as %v, want receive order %v", got, want)
	}
	if n := f.m.acked.get(); n != 4 {
		t.Fatalf("acked metric %d, want 4", n)
	}
}

func TestAcksAreSafeFromManyGoroutines(t *testing.T) {
	f := newFixture(t, Config{CleanSession: true})
	c := newConn()
	const n = 200
	for id := uint16(1); id <= n; id++ {
		f.send(c, "a/x", 1, id, false)
	}
	var wg sync.WaitGroup
	for range n {
		d := f.next()
		wg.Add(1)
		go func() { defer wg.Done(); d.Complete() }()
	}
	wg.Wait()
	got := c.ackedIDs()
	if len(got) != n {
		t.Fatalf("%d acks, want %d", len(got), n)
	}
	for i, id := range got {
		if id != uint16(i+1) {
			t.Fatalf("ack %d is for packet %d, want %d: acks left out of receive order", i, id, i+1)
		}
	}
}

func TestDuplicatePacketIDInFlightIsNotDeliveredTwice(t *testing.T) {
	f := newFixture(t, Config{CleanSession: true})
	c := newConn()
	f.send(c, "a/x", 1, 7, false)
	f.send(c, "a/x", 1, 7, true) // the broker resent it: still in flight here
	d := f.next()
	f.expectNone(time.Now())
	if n := f.m.duplicates.get(); n != 1 {
		t.Fatalf("duplicates metric %d, want 1", n)
	}
	d.Complete()
	// Acknowledged: the broker may reuse the ID for a new message.
	f.send(c, "a/x", 1, 7, false)
	f.next().Complete()
	if got, want := c.ackedIDs(), []uint16{7, 7}; !slices.Equal(got, want) {
		t.Fatalf("acks %v, want %v", got, want)
	}
	if n := f.m.received.get(); n != 2 {
		t.Fatalf("received metric %d, want 2 (the retransmission is not counted)", n)
	}
}

func TestQoS2RetransmissionAfterPubrecIsAnsweredNotDelivered(t *testing.T) {
	f := newFixture(t, Config{CleanSession: true})
	c1 := newConn()
	f.send(c1, "a/x", 2, 9, false)
	f.next().Complete() // PUBREC sent, PUBREL pending
	c1.lose()

	// The PUBREC was lost with the connection: the broker resends the
	// PUBLISH with DUP=1 on the next one. It is answered, not delivered.
	c2 := newConn()
	f.send(c2, "a/x", 2, 9, true)
	f.expectNone(time.Now())
	if got := c2.ackedIDs(); !slices.Equal(got, []uint16{9}) {
		t.Fatalf("acks on the new connection %v, want a PUBREC for 9", got)
	}
	// PUBREL ends the exchange: the ID is new again.
	f.in.OnPubrel(9)
	f.send(c2, "a/x", 2, 9, false)
	f.next()
}

func TestQoS2SameIDWithoutDupIsANewMessage(t *testing.T) {
	f := newFixture(t, Config{CleanSession: true})
	c := newConn()
	f.send(c, "a/x", 2, 3, false)
	f.next().Complete()
	f.send(c, "a/x", 2, 3, false) // DUP=0: the broker considers the old exchange over
	f.next().Complete()
	f.send(c, "a/x", 2, 4, false)
	f.next().Complete()
	f.in.ResetSession() // no session at the broker: no open exchange survives
	f.send(c, "a/x", 2, 4, true)
	f.next()
	if got, want := c.ackedIDs(), []uint16{3, 3, 4}; !slices.Equal(got, want) {
		t.Fatalf("acks %v, want %v", got, want)
	}
}

func TestReplayHoldsUnmatchedUntilTimeoutThenRoutesOrdinarily(t *testing.T) {
	f := newFixture(t, Config{ReplayTimeout: 100 * time.Millisecond})
	c := newConn()
	f.send(c, "old/x", 1, 1, true) // left over from an old subscription: held
	f.send(c, "a/x", 1, 2, false)  // matches: delivered at once, acked past the held one
	f.next().Complete()
	if got := c.ackedIDs(); !slices.Equal(got, []uint16{2}) {
		t.Fatalf("acks %v, want only 2 (the held message is not in the ack order)", got)
	}
	if f.m.held.get() != 1 || f.m.heldTotal.get() != 1 {
		t.Fatalf("held now %d, held total %d, want 1 and 1", f.m.held.get(), f.m.heldTotal.get())
	}
	deadline := time.Now().Add(5 * time.Second)
	for f.m.droppedUnacked.get() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := f.m.droppedUnacked.get(); n != 1 {
		t.Fatalf("dropped unacked %d after the replay timeout, want 1", n)
	}
	if f.m.held.get() != 0 {
		t.Fatalf("held now %d after the timeout, want 0", f.m.held.get())
	}
	if !f.log.contains("session_replay_timeout (100ms) passed: dropping 1 held messages (first on topic \"old/x\")") {
		t.Fatalf("no warning for the expired replay: %v", f.log.lines)
	}
	if got := c.ackedIDs(); !slices.Equal(got, []uint16{2}) {
		t.Fatalf("acks %v after the timeout, want only 2: held messages are dropped without ack", got)
	}
	// Ordinary routing from now on: unmatched is acknowledged and dropped.
	f.send(c, "old/y", 1, 3, false)
	if got := c.ackedIDs(); !slices.Equal(got, []uint16{2, 3}) {
		t.Fatalf("acks %v, want 2 and 3 (unmatched after replay is acked)", got)
	}
	f.expectNone(time.Now())
	if n := f.m.unmatched.get(); n != 1 {
		t.Fatalf("unmatched metric %d, want 1", n)
	}
}

func TestCleanSessionHasNoReplayHold(t *testing.T) {
	f := newFixture(t, Config{CleanSession: true})
	c := newConn()
	f.send(c, "old/x", 1, 1, false)
	if got := c.ackedIDs(); !slices.Equal(got, []uint16{1}) {
		t.Fatalf("acks %v, want 1: with clean_session an unmatched message is acked and dropped", got)
	}
	if f.m.heldTotal.get() != 0 {
		t.Fatal("a clean session held a message")
	}
}

func TestReplayOverflowClosesConnectionWithoutAcks(t *testing.T) {
	f := newFixture(t, Config{ReplayBufferSize: 2})
	c := newConn()
	for id := uint16(1); id <= 3; id++ {
		f.send(c, "old/x", 1, id, false)
	}
	if c.Alive() {
		t.Fatal("the connection survived a replay overflow")
	}
	if c.dropErr == nil || !strings.Contains(c.dropErr.Error(), "session_replay_buffer_size (2)") {
		t.Fatalf("drop reason %v, want one naming session_replay_buffer_size (2)", c.dropErr)
	}
	if got := c.ackedIDs(); len(got) != 0 {
		t.Fatalf("acks %v, want none", got)
	}
	if f.m.overflows.get() != 1 || f.m.held.get() != 0 {
		t.Fatalf("overflows %d, held now %d, want 1 and 0", f.m.overflows.get(), f.m.held.get())
	}
	// Later messages of that connection are ignored.
	f.send(c, "a/x", 1, 4, false)
	f.expectNone(time.Now())
}

func TestRetryBackoffDoublesAndRetriesGoFirst(t *testing.T) {
	f := newFixture(t, Config{CleanSession: true, Retry: backoff.Backoff{Initial: time.Second, Max: 3 * time.Second}})
	c := newConn()
	f.send(c, "a/x", 1, 1, false)
	d := f.next()
	f.in.Retry(d)
	f.send(c, "a/x", 1, 2, false)
	now := time.Now()
	// The retry is not due yet: the queued message comes first.
	if got := f.next(); got.Msg.MessageID() != 2 {
		t.Fatalf("got packet %d, want the queued 2 while 1 waits for its backoff", got.Msg.MessageID())
	}
	due := f.expectNone(now)
	if wait := due.Sub(now); wait <= 0 || wait > time.Second {
		t.Fatalf("first retry due in %s, want within the initial 1s", wait)
	}
	got, _, _, _ := f.in.Next(due)
	if got != d {
		t.Fatal("the due retry was not returned")
	}
	for _, want := range []time.Duration{2 * time.Second, 3 * time.Second, 3 * time.Second} {
		before := time.Now()
		f.in.Retry(d)
		due := f.expectNone(before)
		if wait := due.Sub(before); wait < want || wait > want+time.Second {
			t.Fatalf("retry due in %s, want %s (doubling, capped at the max)", wait, want)
		}
		if got, _, _, _ := f.in.Next(due); got != d {
			t.Fatal("the due retry was not returned")
		}
	}
	if n := f.m.retried.get(); n != 4 {
		t.Fatalf("retried metric %d, want 4", n)
	}
}

func TestLostConnectionDiscardsItsQoS1Deliveries(t *testing.T) {
	f := newFixture(t, Config{CleanSession: true})
	c := newConn()
	f.send(c, "a/x", 1, 1, false)
	f.send(c, "a/x", 0, 0, false)
	f.send(c, "a/x", 1, 2, false)
	d := f.next()
	c.lose()
	if !d.Stale() {
		t.Fatal("a QoS 1 delivery of a lost connection is not stale")
	}
	f.in.Retry(d) // dropped: the broker redelivers it
	deadline := time.Now().Add(5 * time.Second)
	for len(f.in.Queued()) != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	q := f.in.Queued()
	if len(q) != 1 || q[0].Qos() != 0 {
		t.Fatalf("queue after the loss holds %d messages, want only the QoS 0 one", len(q))
	}
	if all, _ := f.in.Retrying(); all != 0 {
		t.Fatalf("%d retries wait, want 0", all)
	}
	d.Complete()
	if got := c.ackedIDs(); len(got) != 0 {
		t.Fatalf("acks %v on a lost connection, want none", got)
	}
}

func TestQoS0CappedAtReceiveBuffer(t *testing.T) {
	f := newFixture(t, Config{CleanSession: true, ReceiveBufferSize: 2})
	c := newConn()
	for id := uint16(1); id <= 5; id++ {
		f.send(c, "a/x", 0, id, false)
	}
	q := f.in.Queued()
	if len(q) != 2 || q[0].MessageID() != 4 || q[1].MessageID() != 5 {
		t.Fatalf("queue %d long, want the newest two (4, 5)", len(q))
	}
	if n := f.m.qos0Dropped.get(); n != 3 {
		t.Fatalf("qos0 dropped %d, want 3", n)
	}
	// QoS 1 beyond the buffer is not dropped: it is backlog.
	for id := uint16(10); id < 13; id++ {
		f.send(c, "a/x", 1, id, false)
	}
	if f.m.buffered.get() != 2 || f.m.backlog.get() != 3 {
		t.Fatalf("buffered %d, backlog %d, want 2 and 3", f.m.buffered.get(), f.m.backlog.get())
	}
}

func TestCloseEndsNextAndIgnoresLaterMessages(t *testing.T) {
	f := newFixture(t, Config{CleanSession: true})
	c := newConn()
	f.send(c, "a/x", 1, 1, false)
	f.in.Close()
	if _, _, _, closed := f.in.Next(time.Now()); !closed {
		t.Fatal("Next after Close does not report closed")
	}
	f.send(c, "a/x", 1, 2, false)
	if got := c.ackedIDs(); len(got) != 0 {
		t.Fatalf("acks %v after Close, want none", got)
	}
	if !c.Alive() {
		t.Fatal("Close dropped the connection: that is the client's job")
	}
}
