package codec

import (
	"errors"
	"strings"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
)

var testTrace = envelope.TraceContext{
	Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	Tracestate:  "vendor=1",
}

// The two record shapes that are reliomq v1 envelopes.
var enveloped = []struct {
	enc Encoding
	dec string
}{
	{Encoding{Mode: Delivery, MaxPayloadBytes: 1 << 20}, Delivery},
	{Encoding{Mode: None, EndToEnd: true, DataTopic: "data", MaxPayloadBytes: 1 << 20}, Ingress},
}

// With trace_context off (the default) a record is the reliomq v1 bytes,
// whatever trace context the span has: nothing is added.
func TestTraceContextOffLeavesTheV1BytesUnchanged(t *testing.T) {
	want := map[string]string{
		Delivery: `{"event_id":"evt-1","payload":{"n":1},"version":1}`,
		Ingress:  `{"event_id":"evt-1","payload":{"n":1},"topic":"a/b","version":1}`,
	}
	for _, c := range enveloped {
		rec, err := c.enc.Encode("evt-1", "a/b", []byte(`{"n": 1}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		added, err := c.enc.AddTraceContext(&rec, testTrace)
		if added || err != nil || string(rec.Payload) != want[c.dec] {
			t.Errorf("%s: added %v, %v, payload %s; want the v1 bytes %s", c.dec, added, err, rec.Payload, want[c.dec])
		}
	}
}

// On: the receiver with the opt-in reads back the event and the trace
// context; a receiver without it refuses the envelope and names the
// setting; a receiver with it still reads envelopes without one.
func TestTraceContextRoundTripAndOneSidedOptIn(t *testing.T) {
	for _, c := range enveloped {
		enc := c.enc
		enc.TraceContext = true
		rec, err := enc.Encode("evt-1", "a/b", []byte(`{"n":1}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		plain := string(rec.Payload)
		if added, err := enc.AddTraceContext(&rec, testTrace); !added || err != nil {
			t.Fatalf("%s: AddTraceContext = %v, %v", c.dec, added, err)
		}
		on := Decoding{Mode: c.dec, TraceContext: true}
		d := on.Decode(rec.Topic, rec.Payload, nil)
		if d.Err != nil || d.Trace != testTrace || d.EventID != "evt-1" || string(d.Body) != `{"n":1}` {
			t.Errorf("%s: decoded %+v", c.dec, d)
		}
		if c.dec == Ingress && d.DestTopic != "a/b" {
			t.Errorf("ingress: destination %q", d.DestTopic)
		}

		off := Decoding{Mode: c.dec}.Decode(rec.Topic, rec.Payload, nil)
		if off.Err == nil || !errors.Is(off.Err, envelope.ErrTraceContext) || !strings.Contains(off.Err.Error(), "set trace_context: envelope on this reliable_mqtt_in") || string(off.Body) != string(rec.Payload) {
			t.Errorf("%s: a receiver without the opt-in: %+v; want a refusal naming trace_context: envelope", c.dec, off)
		}

		old := on.Decode(rec.Topic, []byte(plain), nil)
		if old.Err != nil || old.Trace != (envelope.TraceContext{}) || old.EventID != "evt-1" {
			t.Errorf("%s: a receiver with the opt-in reading a v1 envelope: %+v", c.dec, old)
		}
	}
}

// A malformed traceparent makes the envelope malformed for a receiver with
// the opt-in.
func TestAMalformedTraceparentIsRefused(t *testing.T) {
	bad := `{"event_id":"e","payload":1,"traceparent":"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01","version":1}`
	d := Decoding{Mode: Delivery, TraceContext: true}.Decode("in/x", []byte(bad), nil)
	if d.Err == nil || !strings.Contains(d.Err.Error(), "not a W3C version 00 traceparent") || !strings.Contains(d.Err.Error(), `"in/x"`) {
		t.Errorf("decoded %+v; want a refusal naming the topic and the traceparent", d)
	}
}

// A trace context is never worth refusing an event: one that would take the
// payload beyond max_payload_bytes stays out.
func TestATraceContextThatDoesNotFitStaysOut(t *testing.T) {
	enc := Encoding{Mode: Delivery, TraceContext: true}
	rec, err := enc.Encode("e", "t", []byte(`1`), nil)
	if err != nil {
		t.Fatal(err)
	}
	enc.MaxPayloadBytes = len(rec.Payload) + 10
	before := string(rec.Payload)
	if added, err := enc.AddTraceContext(&rec, testTrace); added || err != nil || string(rec.Payload) != before {
		t.Errorf("added %v, %v, payload %s; want it left out", added, err, rec.Payload)
	}
}

// Two writes of one event differ in their trace context only: the same
// record. Another payload, or another event, is not.
func TestSamePayloadIgnoresOnlyTheTraceContext(t *testing.T) {
	enc := Encoding{Mode: Delivery, TraceContext: true, MaxPayloadBytes: 1 << 20}
	write := func(id, payload string, tc envelope.TraceContext) []byte {
		rec, err := enc.Encode(id, "t", []byte(payload), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := enc.AddTraceContext(&rec, tc); err != nil {
			t.Fatal(err)
		}
		return rec.Payload
	}
	other := envelope.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}
	a := write("e", `{"n":1}`, testTrace)
	for _, c := range []struct {
		name string
		b    []byte
		same bool
	}{
		{"another trace context", write("e", `{"n":1}`, other), true},
		{"no trace context", write("e", `{"n":1}`, envelope.TraceContext{}), true},
		{"another payload", write("e", `{"n":2}`, testTrace), false},
		{"another event", write("f", `{"n":1}`, testTrace), false},
	} {
		if got := SamePayload(a, c.b); got != c.same {
			t.Errorf("%s: SamePayload = %v, want %v", c.name, got, c.same)
		}
	}
}
