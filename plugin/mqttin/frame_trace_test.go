package mqttin

import (
	"fmt"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

var frameSpans = tracetest.NewSpanRecorder()

func init() {
	err := service.RegisterOtelTracerProvider("test_frame_recorder", service.NewConfigSpec(), func(*service.ParsedConfig) (trace.TracerProvider, error) {
		return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(frameSpans)), nil
	})
	if err != nil {
		panic(err)
	}
}

// Each event of a frame keeps its own trace: its receive span is a child of
// the traceparent the event carries (in the frame's trace context, or else
// in its user properties), not of another event's, and an event without one
// starts a trace of its own.
func TestEachEventOfAFrameKeepsItsOwnTrace(t *testing.T) {
	b := startBroker(t)
	run := fmt.Sprint(time.Now().UnixNano())
	parents := map[string]string{ // event ID → traceparent it carries
		"tr-a-" + run: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"tr-b-" + run: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
	events := []frame.Event{
		{ID: "tr-a-" + run, Payload: []byte("1"), Trace: map[string]string{frame.KeyTraceparent: parents["tr-a-"+run]}},
		{ID: "tr-b-" + run, Payload: []byte("2"), Properties: []frame.Property{{Key: "traceparent", Value: parents["tr-b-"+run]}}},
		{ID: "tr-c-" + run, Payload: []byte("3")},
	}
	raw, _, err := frame.Encode(events, frame.Options{})
	if err != nil {
		t.Fatal(err)
	}
	harness.Subscribe(t, b.URL(), "traced-frames", false, "in/#").Close() // the session queues the frame
	acks := harness.Subscribe(t, b.URL(), "ack-watcher", true, "acks/t")
	st := streamtest.StartConfig(t, fmt.Sprintf(`
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: traced-frames
    topics: [ "in/#" ]
    envelope: delivery
    ack_topic: acks/t
output:
  drop: {}
tracer:
  test_frame_recorder: {}
`, b.URL()))
	harness.Publish(t, b.URL(), "in/x", [][]byte{raw})
	ok := acks.WaitCount(1, 20*time.Second)
	st.Stop()
	if !ok {
		t.Fatal("no ACK for the frame")
	}

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range frameSpans.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == "event_id" {
				spans[kv.Value.AsString()] = s
			}
		}
	}
	for _, e := range events {
		s, found := spans[e.ID]
		if !found {
			t.Fatalf("no receive span of %s", e.ID)
		}
		got := fmt.Sprintf("00-%s-%s-01", s.Parent().TraceID(), s.Parent().SpanID())
		if want, traced := parents[e.ID]; traced && got != want {
			t.Errorf("%s: span's parent %s, want the event's own %s", e.ID, got, want)
		} else if !traced && s.Parent().IsValid() {
			t.Errorf("%s carries no trace context, yet its span has the parent %s", e.ID, got)
		}
	}
	if spans[events[2].ID].SpanContext().TraceID() == spans[events[0].ID].SpanContext().TraceID() {
		t.Error("an event without a trace context joined another event's trace")
	}
}
