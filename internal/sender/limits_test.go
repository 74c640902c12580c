package sender

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/internal/properties"
)

// TestWindowNeverExceedsTheServersReceiveMaximum: with a configured window
// of 64 and a server Receive Maximum of 5, a session's window publishes 5
// records and no more until one is confirmed.
func TestWindowNeverExceedsTheServersReceiveMaximum(t *testing.T) {
	ob := openOutbox(t, 20)
	lim := mqttclient.NoLimits
	lim.ReceiveMaximum = 5
	w := newWindow(windowSize(64, lim), time.Minute)
	var s sent
	refill(t, w, ob, noSkip, &s)
	if len(s.ids) != 5 || w.len() != 5 {
		t.Fatalf("published %v (%d in flight), want 5 with Receive Maximum 5", s.ids, w.len())
	}
	confirm(t, w, "e1")
	refill(t, w, ob, noSkip, &s)
	if len(s.ids) != 6 || w.len() != 5 {
		t.Fatalf("after one confirmation: published %d (%d in flight), want 6 (5)", len(s.ids), w.len())
	}
	if got := windowSize(64, mqttclient.NoLimits); got != 64 {
		t.Fatalf("windowSize with no server limit = %d, want the configured 64", got)
	}
	lim.ReceiveMaximum = 1000
	if got := windowSize(64, lim); got != 64 {
		t.Fatalf("windowSize(64, Receive Maximum 1000) = %d, want 64", got)
	}
}

// TestUnreadTokensSkipFlightsConfirmedFirst: with end_to_end an ACK can
// confirm a record before its PUBACK is read; the PUBACK queue then skips it.
func TestUnreadTokensSkipFlightsConfirmedFirst(t *testing.T) {
	ob := openOutbox(t, 3)
	w := newWindow(3, time.Minute)
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

func TestRecordPublicationCarriesStoredProperties(t *testing.T) {
	props := properties.Stamp(&mqttclient.Properties{ContentType: "application/octet-stream"}, "ev-1", "dest/topic")
	rec := outbox.Record{EventID: "ev-1", Topic: properties.StoreTopic("data", props), Payload: []byte{0xff, 0, 1}}
	pub, err := recordPublication(rec, Config{RequireSubscribers: true})
	if err != nil {
		t.Fatal(err)
	}
	if pub.Topic != "data" || pub.QoS != 1 || string(pub.Payload) != "\xff\x00\x01" || !pub.RequireSubscribers {
		t.Fatalf("publication %+v", pub)
	}
	if v, _ := pub.Props.Get("event_id"); v != "ev-1" || pub.Props.ContentType != "application/octet-stream" {
		t.Fatalf("properties %+v", pub.Props)
	}
	plain, err := recordPublication(outbox.Record{EventID: "e", Topic: "t", Payload: []byte("x")}, Config{})
	if err != nil || plain.Props != nil {
		t.Fatalf("a record without properties: %+v, %v", plain, err)
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
