package outbox

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// TestSamePayloadDecidesWhetherARewriteIsThePendingRecord: with
// Options.SamePayload = codec.SamePayload (trace_context: envelope), a
// write of a pending event ID whose envelope differs only in its trace
// context is the pending record, which keeps its bytes; another payload is
// still a conflict. Without the option the bytes decide.
func TestSamePayloadDecidesWhetherARewriteIsThePendingRecord(t *testing.T) {
	traced := func(payload, parent string) []byte {
		env, err := envelope.EncodeDelivery("a", []byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		if env, err = envelope.AddTraceContext(env, envelope.TraceContext{Traceparent: parent}); err != nil {
			t.Fatal(err)
		}
		return env
	}
	first := traced(`{"n":1}`, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	second := traced(`{"n":1}`, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")

	o := openT(t, filepath.Join(t.TempDir(), "outbox.db"), Options{SamePayload: codec.SamePayload})
	r1, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "a", Topic: "t", Payload: first}})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "a", Topic: "t", Payload: second}})
	if err != nil || r2.Seq != r1.Seq || string(r2.Payload) != string(first) {
		t.Fatalf("rewrite with another traceparent: seq %d, payload %s, %v; want the pending seq %d with its own bytes", r2.Seq, r2.Payload, err, r1.Seq)
	}
	if _, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "a", Topic: "t", Payload: traced(`{"n":2}`, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}); !errors.Is(err, ErrEventIDConflict) {
		t.Fatalf("rewrite with another payload: %v, want ErrEventIDConflict", err)
	}

	plain := openT(t, filepath.Join(t.TempDir(), "outbox.db"), Options{})
	if _, err := plain.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "a", Topic: "t", Payload: first}}); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "a", Topic: "t", Payload: second}}); !errors.Is(err, ErrEventIDConflict) {
		t.Fatalf("without SamePayload a rewrite with other bytes: %v, want ErrEventIDConflict", err)
	}
}
