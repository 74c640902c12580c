package sender

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
)

// The window reads a real outbox (a bbolt file in a temporary directory);
// only the broker is left out: a publish completes at once.

type doneToken struct{}

func (doneToken) Done() <-chan struct{} { ch := make(chan struct{}); close(ch); return ch }
func (doneToken) Error() error          { return nil }

func openOutbox(t *testing.T, n int) *outbox.Outbox {
	t.Helper()
	ob, err := outbox.Open(filepath.Join(t.TempDir(), "outbox.db"), outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ob.Close() })
	appendEvents(t, ob, 1, n)
	return ob
}

func appendEvents(t *testing.T, ob *outbox.Outbox, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := from; i <= to; i++ {
		if _, err := ob.Append(ctx, outbox.Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "t", Payload: []byte("p")}}); err != nil {
			t.Fatal(err)
		}
	}
}

// sent records what a window published, in order.
type sent struct{ ids []string }

func (s *sent) publish(r outbox.Record) Token { s.ids = append(s.ids, r.EventID); return doneToken{} }

func noSkip(uint64) bool { return false }

func noCorrupt(t *testing.T) func(*outbox.CorruptRecordError) {
	return func(err *outbox.CorruptRecordError) { t.Fatalf("unexpected corrupt record: %v", err) }
}

func refill(t *testing.T, w *window, ob *outbox.Outbox, skip func(uint64) bool, s *sent) {
	t.Helper()
	if err := w.refill(ob, skip, one(s.publish), noCorrupt(t)); err != nil {
		t.Fatal(err)
	}
}

// fixedWindow is a window of size records (a sizer whose floor is its
// bound: size at most initialWindow) on a server without a Receive Maximum.
func fixedWindow(size int) *window {
	return newWindow(newSizer(size, initialWindow, time.Now()), pubackLimit(mqttclient.NoLimits), 1, time.Minute)
}

func confirm(t *testing.T, w *window, ids ...string) []uint64 {
	t.Helper()
	var seqs []uint64
	for _, id := range ids {
		f := w.lookup(id)
		if f == nil {
			t.Fatalf("%s is not in flight", id)
		}
		seqs = append(seqs, f.rec.Seq)
		w.remove(f, time.Now())
	}
	return seqs
}

func TestWindowRefillKeepsAtMostSizeInFlightInFIFOOrder(t *testing.T) {
	ob := openOutbox(t, 10)
	w := fixedWindow(3)
	s := &sent{}
	refill(t, w, ob, noSkip, s)
	if !slices.Equal(s.ids, []string{"e1", "e2", "e3"}) || w.len() != 3 {
		t.Fatalf("published %v with %d in flight, want e1..e3 and 3", s.ids, w.len())
	}
	refill(t, w, ob, noSkip, s) // full: nothing more
	if len(s.ids) != 3 {
		t.Fatalf("a full window published %v", s.ids[3:])
	}
	// A confirmation out of order (end-to-end ACKs may arrive so) makes
	// room for exactly one more, the next in FIFO order.
	confirm(t, w, "e2")
	refill(t, w, ob, noSkip, s)
	if !slices.Equal(s.ids, []string{"e1", "e2", "e3", "e4"}) {
		t.Fatalf("published %v, want e4 next", s.ids)
	}
	if f := w.oldest(); f == nil || f.rec.EventID != "e1" {
		t.Fatal("the oldest flight is not e1")
	}
	confirm(t, w, "e1", "e3")
	refill(t, w, ob, noSkip, s)
	if !slices.Equal(s.ids[4:], []string{"e5", "e6"}) || w.oldest().rec.EventID != "e4" {
		t.Fatalf("published %v, oldest %s; want e5, e6 and oldest e4", s.ids, w.oldest().rec.EventID)
	}
}

func TestWindowDeadlinesGrowFromOldest(t *testing.T) {
	ob := openOutbox(t, 5)
	w := fixedWindow(5)
	refill(t, w, ob, noSkip, &sent{})
	var last time.Time
	for e := w.inflight.Front(); e != nil; e = e.Next() {
		f := e.Value.(*flight)
		if f.deadline.Before(last) {
			t.Fatalf("deadline of %s is before the one of the record ahead of it", f.rec.EventID)
		}
		if d := f.deadline.Sub(f.sentAt); d != time.Minute {
			t.Fatalf("deadline of %s is %s after its send, want 1m", f.rec.EventID, d)
		}
		last = f.deadline
	}
}

func TestWindowRefillPicksUpAppendsAfterRunningDry(t *testing.T) {
	ob := openOutbox(t, 2)
	w := fixedWindow(8)
	s := &sent{}
	refill(t, w, ob, noSkip, s)
	confirm(t, w, "e1", "e2")
	refill(t, w, ob, noSkip, s) // nothing new: returns with an empty window
	if w.len() != 0 || len(s.ids) != 2 {
		t.Fatalf("%d in flight after %v, want 0 after e1, e2", w.len(), s.ids)
	}
	appendEvents(t, ob, 3, 4)
	refill(t, w, ob, noSkip, s)
	if !slices.Equal(s.ids, []string{"e1", "e2", "e3", "e4"}) {
		t.Fatalf("published %v, want e3 and e4 after e1, e2 and nothing twice", s.ids)
	}
}

// After a failed session the next one starts a new window: everything not
// confirmed is sent again from the oldest, and what was confirmed but not
// yet removed from the outbox is not.
func TestNewWindowResendsFromOldestUnconfirmed(t *testing.T) {
	ob := openOutbox(t, 8)
	first := fixedWindow(4)
	s1 := &sent{}
	refill(t, first, ob, noSkip, s1)
	confirmed := map[uint64]bool{}
	for _, seq := range confirm(t, first, "e2") {
		confirmed[seq] = true // confirmed, removal pending
	}
	// The session fails here (a timeout on e1, a lost connection).

	second := fixedWindow(4)
	s2 := &sent{}
	skip := func(seq uint64) bool { return confirmed[seq] }
	refill(t, second, ob, skip, s2)
	if want := []string{"e1", "e3", "e4", "e5"}; !slices.Equal(s2.ids, want) {
		t.Fatalf("the next session sent %v, want %v: from the oldest, without the confirmed e2", s2.ids, want)
	}

	// The removal lands and e1, e3 are confirmed; the session fails again.
	seqs := confirm(t, second, "e1", "e3")
	for seq := range confirmed {
		seqs = append(seqs, seq)
	}
	if err := ob.Remove(seqs...); err != nil {
		t.Fatal(err)
	}
	third := fixedWindow(4)
	s3 := &sent{}
	refill(t, third, ob, noSkip, s3)
	if want := []string{"e4", "e5", "e6", "e7"}; !slices.Equal(s3.ids, want) {
		t.Fatalf("the third session sent %v, want %v", s3.ids, want)
	}
}

type testMetrics struct {
	mu      sync.Mutex
	ignored map[string]int
	codes   map[byte]int
}

func (m *testMetrics) OnPublished()               {}
func (m *testMetrics) OnConfirmed(time.Duration)  {}
func (m *testMetrics) OnRetried()                 {}
func (m *testMetrics) SetConnected(bool)          {}
func (m *testMetrics) SetWindow(int)              {}
func (m *testMetrics) OnIgnoredACK(reason string) { m.mu.Lock(); m.ignored[reason]++; m.mu.Unlock() }
func (m *testMetrics) OnReasonCode(code byte)     { m.mu.Lock(); m.codes[code]++; m.mu.Unlock() }

type testLog struct{ lines []string }

func (l *testLog) Infof(f string, a ...any)  { l.lines = append(l.lines, fmt.Sprintf(f, a...)) }
func (l *testLog) Warnf(f string, a ...any)  { l.lines = append(l.lines, fmt.Sprintf(f, a...)) }
func (l *testLog) Errorf(f string, a ...any) { l.lines = append(l.lines, fmt.Sprintf(f, a...)) }

func TestIgnoredACKsTellDuplicateFromUnknownAndRateLimitTheLog(t *testing.T) {
	m := &testMetrics{ignored: map[string]int{}}
	log := &testLog{}
	a := NewIgnoredACKs(m, log)
	a.confirmed("e1")
	a.unmatched("e1")
	a.unmatched("e1")
	a.unmatched("zz")
	if m.ignored["duplicate"] != 2 || m.ignored["unknown"] != 1 {
		t.Fatalf("ignored %v, want 2 duplicate and 1 unknown", m.ignored)
	}
	if len(log.lines) != 2 {
		t.Fatalf("%d warnings, want one per reason within the interval: %q", len(log.lines), log.lines)
	}
	if !strings.Contains(log.lines[0], "Ignoring duplicate ACK for event e1") {
		t.Fatalf("first warning %q", log.lines[0])
	}
}

func TestAckQueueIsBounded(t *testing.T) {
	q := NewAckQueue()
	for i := range maxQueuedAcks {
		if !q.Push(fmt.Sprint(i)) {
			t.Fatalf("push %d refused below the bound", i)
		}
	}
	if q.Push("one more") {
		t.Fatal("push beyond maxQueuedAcks accepted")
	}
	if n := len(q.drain()); n != maxQueuedAcks {
		t.Fatalf("drained %d, want %d", n, maxQueuedAcks)
	}
	if !q.Push("after drain") {
		t.Fatal("push after drain refused")
	}
}

// readCounter is an outbox that counts the records a window asks for.
type readCounter struct {
	ob    *outbox.Outbox
	asked []int
}

func (r *readCounter) Read(after uint64, max int) ([]outbox.Record, error) {
	r.asked = append(r.asked, max)
	return r.ob.Read(after, max)
}

// A refill reads what its free publishes can carry, not the whole room of
// a large window: with 1,000 records of room, 2 publishes free and frames
// of 4, it asks for 8 records and publishes two frames of 4.
func TestARefillReadsNoMoreThanItsPublishesCarry(t *testing.T) {
	ob := openOutbox(t, 100)
	src := &readCounter{ob: ob}
	w := newWindow(newSizer(1000, 1000, time.Now()), 2, 4, time.Minute)
	var frames [][]string
	frameOf4 := func(recs []outbox.Record) (int, string, Token) {
		n := min(4, len(recs))
		var ids []string
		for _, r := range recs[:n] {
			ids = append(ids, r.EventID)
		}
		frames = append(frames, ids)
		return n, "f-" + ids[0], &testToken{done: make(chan struct{})}
	}
	if err := w.refill(src, noSkip, frameOf4, noCorrupt(t)); err != nil {
		t.Fatal(err)
	}
	if want := [][]string{{"e1", "e2", "e3", "e4"}, {"e5", "e6", "e7", "e8"}}; !slices.EqualFunc(frames, want, slices.Equal) {
		t.Fatalf("published %v, want %v", frames, want)
	}
	if !slices.Equal(src.asked, []int{8}) {
		t.Fatalf("the refill asked the outbox for %v records, want [8]", src.asked)
	}
}
