package inbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
)

// testHooks are an attempt's delivery hooks: they record the result they
// were run with and return err.
type testHooks struct {
	mu      sync.Mutex
	err     error
	results []error
	events  *[]string
}

func (h *testHooks) Run(_ context.Context, result error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.results = append(h.results, result)
	if h.events != nil {
		*h.events = append(*h.events, "hooks")
	}
	return h.err
}

const ackTopic = "acks"

// endToEnd is a fixture whose deliveries carry reliomq v1 delivery
// envelopes and are acknowledged end to end on ackTopic; ready is the
// client's ready connection.
func endToEnd(t *testing.T, ready *testConn) *fixture {
	return newFixture(t, Config{CleanSession: true, Envelope: codec.Delivery,
		Retry: backoff.Backoff{Initial: time.Millisecond, Max: time.Millisecond},
		Ack: EndToEnd{Topic: ackTopic, Timeout: 5 * time.Second,
			Ready: func(context.Context) (Conn, error) { return ready, nil }}})
}

// sendEnvelope sends event id in a delivery envelope.
func (f *fixture) sendEnvelope(c *testConn, qos byte, id uint16, eventID string) {
	f.t.Helper()
	payload, err := envelope.EncodeDelivery(eventID, []byte(`{"n":1}`))
	if err != nil {
		f.t.Fatal(err)
	}
	f.in.OnMessage(c, &testMsg{conn: c, topic: "a/x", qos: qos, id: id, payload: payload})
}

func (f *fixture) read() *Delivery {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := f.in.Read(ctx)
	if err != nil {
		f.t.Fatalf("Read: %v", err)
	}
	return d
}

// ackedEvent is the event ID of an end-to-end ACK.
func ackedEvent(t *testing.T, payload []byte) string {
	t.Helper()
	id, err := envelope.DecodeAck(payload)
	if err != nil {
		t.Fatalf("the published ACK %q does not decode: %v", payload, err)
	}
	return id
}

// What runs before the PUBACK: the hooks, then the end-to-end ACK (its
// PUBACK awaited), then the source's PUBACK, in that order.
func TestSettleRunsHooksThenEndToEndAckThenPuback(t *testing.T) {
	var events []string
	c := newConn()
	c.events = &events
	f := endToEnd(t, newConn())
	f.sendEnvelope(c, 1, 1, "ev-1")
	d := f.read()
	if d.Decoded == nil || d.Decoded.EventID != "ev-1" || string(d.Decoded.Body) != `{"n":1}` {
		t.Fatalf("Decoded = %+v, want event ev-1 with body {\"n\":1}", d.Decoded)
	}
	hooks := &testHooks{events: &events}
	f.in.Settle(context.Background(), d, hooks, nil)

	if len(events) != 3 || events[0] != "hooks" || !strings.HasPrefix(events[1], "publish "+ackTopic+" ") || events[2] != "puback 1" {
		t.Fatalf("events %q, want hooks, the ACK's publish to %q, then puback 1", events, ackTopic)
	}
	if id := ackedEvent(t, c.published[0].Payload); id != "ev-1" || c.published[0].QoS != 1 {
		t.Fatalf("ACK for %q at QoS %d, want ev-1 at QoS 1", id, c.published[0].QoS)
	}
	if !slices.Equal(hooks.results, []error{nil}) {
		t.Fatalf("hooks ran with %v, want once with success", hooks.results)
	}
	if f.m.acksPublished.get() != 1 || f.m.rejected.get() != 0 {
		t.Fatalf("acks published %d, rejected %d; want 1 and 0", f.m.acksPublished.get(), f.m.rejected.get())
	}
}

// A hook's error on success fails the attempt: no ACK, no PUBACK, and the
// message is read again after the retry backoff.
func TestSettleAcksNothingAndRetriesWhenAHookFails(t *testing.T) {
	c := newConn()
	f := endToEnd(t, newConn())
	f.sendEnvelope(c, 1, 1, "ev-1")
	d := f.read()
	f.in.Settle(context.Background(), d, &testHooks{err: errors.New("ledger down")}, nil)
	if len(c.published) != 0 || len(c.ackedIDs()) != 0 {
		t.Fatalf("published %d ACKs and PUBACKs %v after a failed hook, want none", len(c.published), c.ackedIDs())
	}
	if all, _ := f.in.Retrying(); all != 1 || f.m.rejected.get() != 1 {
		t.Fatalf("retrying %d, rejected %d; want 1 and 1", all, f.m.rejected.get())
	}
	if !f.log.contains("delivery hook failed: ledger down") {
		t.Fatal("the rejection's reason is not logged")
	}
	again := f.read()
	if again != d {
		t.Fatal("the retried delivery is not the same delivery")
	}
	f.in.Settle(context.Background(), again, &testHooks{}, nil)
	if got := c.ackedIDs(); !slices.Equal(got, []uint16{1}) || len(c.published) != 1 {
		t.Fatalf("after a successful retry: PUBACKs %v and %d ACKs, want [1] and 1", got, len(c.published))
	}
}

// A failed pipeline runs the hooks with its error and acknowledges nothing.
func TestSettleOfAFailedAttemptRunsHooksWithItsErrorAndAcksNothing(t *testing.T) {
	c := newConn()
	f := endToEnd(t, newConn())
	f.sendEnvelope(c, 1, 1, "ev-1")
	failed := errors.New("output refused it")
	hooks := &testHooks{}
	f.in.Settle(context.Background(), f.read(), hooks, failed)
	if !slices.Equal(hooks.results, []error{failed}) {
		t.Fatalf("hooks ran with %v, want the pipeline's error", hooks.results)
	}
	if len(c.published) != 0 || len(c.ackedIDs()) != 0 || f.m.rejected.get() != 1 {
		t.Fatalf("published %d ACKs, PUBACKs %v, rejected %d; want none, none, 1", len(c.published), c.ackedIDs(), f.m.rejected.get())
	}
}

// An ACK the broker does not confirm fails the attempt: no PUBACK.
func TestSettleSendsNoPubackWhenTheEndToEndAckFails(t *testing.T) {
	c := newConn()
	c.publishErr = errors.New("PUBACK reason code 0x87")
	f := endToEnd(t, newConn())
	f.sendEnvelope(c, 1, 1, "ev-1")
	f.in.Settle(context.Background(), f.read(), &testHooks{}, nil)
	if len(c.ackedIDs()) != 0 {
		t.Fatalf("PUBACKs %v after the ACK failed, want none", c.ackedIDs())
	}
	if f.m.ackPublishFails.get() != 1 || f.m.acksPublished.get() != 0 || f.m.rejected.get() != 1 {
		t.Fatalf("ACK fails %d, published %d, rejected %d; want 1, 0, 1", f.m.ackPublishFails.get(), f.m.acksPublished.get(), f.m.rejected.get())
	}
	if all, _ := f.in.Retrying(); all != 1 {
		t.Fatalf("retrying %d, want 1", all)
	}
}

// The ACK of a QoS 1 message goes on the connection it came from (so it
// precedes that connection's PUBACK); a QoS 0 message has no PUBACK, and
// its ACK goes on the client's ready connection.
func TestEndToEndAckGoesOnTheMessagesConnectionOrTheReadyOneForQoS0(t *testing.T) {
	from, ready := newConn(), newConn()
	f := endToEnd(t, ready)
	f.sendEnvelope(from, 1, 1, "ev-qos1")
	f.in.Settle(context.Background(), f.read(), &testHooks{}, nil)
	f.sendEnvelope(from, 0, 0, "ev-qos0")
	f.in.Settle(context.Background(), f.read(), &testHooks{}, nil)
	if len(from.published) != 1 || ackedEvent(t, from.published[0].Payload) != "ev-qos1" {
		t.Fatalf("the message's connection carried %d ACKs, want the QoS 1 one only", len(from.published))
	}
	if len(ready.published) != 1 || ackedEvent(t, ready.published[0].Payload) != "ev-qos0" {
		t.Fatalf("the ready connection carried %d ACKs, want the QoS 0 one only", len(ready.published))
	}
}

// A malformed envelope is counted once. Dropped (the default), it is
// acknowledged and never read; flagged, it is read with its error, never
// produces an end-to-end ACK, and is acknowledged when settled.
func TestMalformedEnvelopeIsDroppedWithItsPubackOrFlagged(t *testing.T) {
	for _, flag := range []bool{false, true} {
		c := newConn()
		f := newFixture(t, Config{CleanSession: true, Envelope: codec.Ingress, FlagMalformed: flag,
			Retry: backoff.Backoff{Initial: time.Millisecond, Max: time.Millisecond},
			Ack:   EndToEnd{Topic: ackTopic, Timeout: time.Second}})
		f.in.OnMessage(c, &testMsg{conn: c, topic: "a/x", qos: 1, id: 1, payload: []byte("not an envelope")})
		good, err := envelope.EncodeIngress("ev-2", "dest", []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		f.in.OnMessage(c, &testMsg{conn: c, topic: "a/x", qos: 1, id: 2, payload: good})

		d := f.read()
		if !flag {
			if d.Msg.MessageID() != 2 || !slices.Equal(c.ackedIDs(), []uint16{1}) {
				t.Fatalf("drop: read packet %d with PUBACKs %v; want packet 2 read and 1 acknowledged", d.Msg.MessageID(), c.ackedIDs())
			}
			if !f.log.contains("dropped and acknowledged (on_malformed: drop)") || f.m.malformed.get() != 1 {
				t.Fatalf("drop: malformed %d, want 1 and a warning", f.m.malformed.get())
			}
			continue
		}
		if d.Msg.MessageID() != 1 || d.Decoded.Err == nil || !errors.Is(d.Decoded.Err, envelope.ErrMalformed) || string(d.Decoded.Body) != "not an envelope" {
			t.Fatalf("flag: read packet %d decoded %+v; want packet 1 with its error and payload", d.Msg.MessageID(), d.Decoded)
		}
		f.in.Settle(context.Background(), d, &testHooks{}, errors.New("dead-letter output down"))
		time.Sleep(5 * time.Millisecond) // past the 1 ms backoff: a due retry goes before packet 2
		if again := f.read(); again != d || f.m.malformed.get() != 1 {
			t.Fatalf("flag: the retry is another delivery or was decoded again (malformed %d, want 1)", f.m.malformed.get())
		}
		f.in.Settle(context.Background(), d, &testHooks{}, nil)
		if len(c.published) != 0 || !slices.Equal(c.ackedIDs(), []uint16{1}) {
			t.Fatalf("flag: %d ACKs and PUBACKs %v; want no ACK and packet 1 acknowledged", len(c.published), c.ackedIDs())
		}
	}
}
