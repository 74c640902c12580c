package sender

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/internal/properties"
)

// TestWindowNeverExceedsTheServersReceiveMaximum: with a window of 64 and a
// server Receive Maximum of 5, a session's window publishes 5 records and
// no more until one is confirmed by its PUBACK.
func TestWindowNeverExceedsTheServersReceiveMaximum(t *testing.T) {
	ob := openOutbox(t, 20)
	lim := mqttclient.NoLimits
	lim.ReceiveMaximum = 5
	w := newWindow(newSizer(64, initialWindow, time.Now()), pubackLimit(lim), 1, time.Minute)
	var s sent
	refill(t, w, ob, noSkip, &s)
	if len(s.ids) != 5 || w.len() != 5 {
		t.Fatalf("published %v (%d in flight), want 5 with Receive Maximum 5", s.ids, w.len())
	}
	if !w.heldByServer {
		t.Fatal("the window is held at the Receive Maximum below its limit, but heldByServer is not set")
	}
	confirm(t, w, "e1") // confirm: broker: its PUBACK, read and confirmed
	refill(t, w, ob, noSkip, &s)
	if len(s.ids) != 6 || w.len() != 5 {
		t.Fatalf("after one confirmation: published %d (%d in flight), want 6 (5)", len(s.ids), w.len())
	}
	if got := pubackLimit(mqttclient.NoLimits); got != 65535 {
		t.Fatalf("pubackLimit with no server limit = %d, want 65535", got)
	}
}

// TestEndToEndRecordsPUBACKedDoNotCountAgainstReceiveMaximum: with
// end_to_end a record whose PUBACK came holds no packet ID while it waits
// for its ACK, so a Receive Maximum of 5 bounds only those awaiting a PUBACK.
func TestEndToEndRecordsPUBACKedDoNotCountAgainstReceiveMaximum(t *testing.T) {
	ob := openOutbox(t, 40)
	w := newWindow(newSizer(16, initialWindow, time.Now()), 5, 1, time.Minute)
	var s pending
	if err := w.refill(ob, noSkip, one(s.publish), noCorrupt(t)); err != nil {
		t.Fatal(err)
	}
	if len(s.toks) != 5 {
		t.Fatalf("published %d before any PUBACK, want the Receive Maximum of 5", len(s.toks))
	}
	s.puback(3) // PUBACKs of e1..e3; their ACKs are still to come
	readPUBACKs(w)
	if err := w.refill(ob, noSkip, one(s.publish), noCorrupt(t)); err != nil {
		t.Fatal(err)
	}
	if len(s.toks) != 8 || w.len() != 8 {
		t.Fatalf("published %d (%d unconfirmed), want 8: 3 PUBACKed awaiting their ACK and 5 awaiting a PUBACK", len(s.toks), w.len())
	}
	// An ACK before its PUBACK (e4): the record is confirmed but still
	// holds its packet ID until the PUBACK comes.
	confirm(t, w, "e4")
	if err := w.refill(ob, noSkip, one(s.publish), noCorrupt(t)); err != nil {
		t.Fatal(err)
	}
	if len(s.toks) != 8 {
		t.Fatalf("published %d, want still 8: e4 awaits its PUBACK", len(s.toks))
	}
	s.puback(5) // e4 and e5
	readPUBACKs(w)
	if err := w.refill(ob, noSkip, one(s.publish), noCorrupt(t)); err != nil {
		t.Fatal(err)
	}
	if len(s.toks) != 10 || w.len() != 9 {
		t.Fatalf("published %d (%d unconfirmed), want 10 (9)", len(s.toks), w.len())
	}
}

// pending publishes with tokens the test completes: its PUBACKs.
type pending struct{ toks []*testToken }

type testToken struct{ done chan struct{} }

func (t *testToken) Done() <-chan struct{} { return t.done }
func (t *testToken) Error() error          { return nil }

func (p *pending) publish(outbox.Record) Token {
	tok := &testToken{done: make(chan struct{})}
	p.toks = append(p.toks, tok)
	return tok
}

// puback completes the tokens of the first n publishes.
func (p *pending) puback(n int) {
	for _, tok := range p.toks[:n] {
		select {
		case <-tok.done:
		default:
			close(tok.done)
		}
	}
}

// readPUBACKs reads every completed token in order, as the session does.
func readPUBACKs(w *window) {
	for f := w.nextUnread(); f != nil && tokenDone(f.tok); f = w.nextUnread() {
		w.read()
	}
}

// TestUnreadTokensSkipFlightsConfirmedFirst: with end_to_end an ACK can
// confirm a record before its PUBACK is read; the PUBACK queue then skips it.
func TestUnreadTokensSkipFlightsConfirmedFirst(t *testing.T) {
	ob := openOutbox(t, 3)
	w := fixedWindow(3)
	var s sent
	refill(t, w, ob, noSkip, &s)
	confirm(t, w, "e1", "e2")
	f := w.nextUnread()
	if f == nil || f.rec.EventID != "e3" {
		t.Fatalf("next unread PUBACK is %v, want e3", f)
	}
	w.read()
	if f := w.nextUnread(); f != nil {
		t.Fatalf("next unread after reading e3: %s, want none", f.rec.EventID)
	}
}

// A record published alone carries its stored properties.
func TestALonePublishCarriesStoredProperties(t *testing.T) {
	props := properties.Stamp(&mqttmsg.Properties{ContentType: "application/octet-stream"}, "ev-1", "dest/topic")
	rec := outbox.Record{Event: mqttmsg.Event{EventID: "ev-1", Topic: "data", Props: props, Payload: []byte{0xff, 0, 1}}}
	_, _, pub := Config{RequireSubscribers: true}.nextPublish([]mqttmsg.Event{rec.Event}, 0)
	if pub.Topic != "data" || pub.QoS != 1 || string(pub.Payload) != "\xff\x00\x01" || !pub.RequireSubscribers {
		t.Fatalf("publication %+v", pub)
	}
	if v, _ := pub.Props.Get("event_id"); v != "ev-1" || pub.Props.ContentType != "application/octet-stream" {
		t.Fatalf("properties %+v", pub.Props)
	}
	if _, _, plain := (Config{}).nextPublish([]mqttmsg.Event{{EventID: "e", Topic: "t", Payload: []byte("x")}}, 0); plain.Props != nil {
		t.Fatalf("a record without properties: %+v", plain)
	}
}

func TestPublishFailedCountsReasonCodes(t *testing.T) {
	m := &testMetrics{codes: map[byte]int{}}
	err := publishFailed(m, "ev-1", "a/b", &mqttclient.ReasonCodeError{Packet: "PUBACK", Code: 0x87, Reason: "not authorized"})
	if !strings.Contains(err.Error(), "0x87") || !strings.Contains(err.Error(), "not authorized") || !strings.Contains(err.Error(), "ev-1") {
		t.Fatalf("error %q does not name the code, reason and event", err)
	}
	err = publishFailed(m, "ev-2", "a/b", &mqttclient.ReasonCodeError{Packet: "PUBACK", Code: 0x10})
	if !strings.Contains(err.Error(), "require_subscribers") {
		t.Fatalf("0x10: %q", err)
	}
	_ = publishFailed(m, "ev-3", "a/b", errors.New("connection lost"))
	if m.codes[0x87] != 1 || m.codes[0x10] != 1 || len(m.codes) != 2 {
		t.Fatalf("counted %v, want one 0x87 and one 0x10", m.codes)
	}
}
