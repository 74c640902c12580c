package mqttin

import (
	"context"
	"strings"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
)

// A publisher with trace_context: envelope sends envelopes with a
// traceparent. An input without the setting flags them malformed with an
// error that names the setting; an input with it reads them (and plain v1
// envelopes) as the events they are, and refuses a malformed traceparent.
func TestATracedEnvelopeIsReadOnlyWithTheSettingAndTheRefusalNamesIt(t *testing.T) {
	b := startBroker(t)
	ing, err := envelope.EncodeIngress("ev-1", "dest/x", []byte(`{"n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	traced, err := envelope.AddTraceContext(ing, envelope.TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	if err != nil {
		t.Fatal(err)
	}
	badParent := strings.Replace(string(traced), `"00-4bf9`, `"01-4bf9`, 1)

	off := openInput(t, inputYAML(b.URL(), "trace-off", []string{"off/#"}, "envelope: ingress", "on_malformed: flag"))
	publish(t, b.URL(), "off/x", string(traced))
	msg, ack := off.read()
	if err := msg.GetError(); err == nil || !strings.Contains(err.Error(), "set trace_context: envelope on this reliable_mqtt_in") {
		t.Errorf("without the setting: error %v, want a refusal naming trace_context: envelope", err)
	}
	_ = ack(context.Background(), nil)
	off.close()

	on := openInput(t, inputYAML(b.URL(), "trace-on", []string{"on/#"}, "envelope: ingress", "on_malformed: flag", "trace_context: envelope"))
	publish(t, b.URL(), "on/x", string(traced), string(ing), badParent)
	for i, what := range []string{"traced", "plain v1"} {
		msg, ack := on.read()
		if err := msg.GetError(); err != nil || body(msg) != `{"n":1}` || meta(msg, metaEventID) != "ev-1" || meta(msg, metaDestTopic) != "dest/x" {
			t.Errorf("%d (%s): body %q, event_id %q, destination %q, error %v", i, what, body(msg), meta(msg, metaEventID), meta(msg, metaDestTopic), err)
		}
		_ = ack(context.Background(), nil)
	}
	msg, ack = on.read()
	if err := msg.GetError(); err == nil || !strings.Contains(err.Error(), "not a W3C version 00 traceparent") {
		t.Errorf("a version 01 traceparent: error %v, want a refusal", err)
	}
	_ = ack(context.Background(), nil)
	on.close()
}
