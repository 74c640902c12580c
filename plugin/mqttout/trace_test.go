package mqttout_test

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
)

// recorded holds the spans of every stream that uses the tracer
// `test_recorder`; tests tell theirs apart by event IDs of their own run
// (runID: -count=N runs a test N times in one process).
var recorded = tracetest.NewSpanRecorder()

func init() {
	err := service.RegisterOtelTracerProvider("test_recorder", service.NewConfigSpec(), func(*service.ParsedConfig) (trace.TracerProvider, error) {
		return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorded)), nil
	})
	if err != nil {
		panic(err)
	}
}

// deliverParent is the traceparent of the first `deliver` span of eventID.
func deliverParent(t *testing.T, eventID string) string {
	t.Helper()
	for _, s := range recorded.Started() {
		for _, kv := range s.Attributes() {
			if kv.Key == "event_id" && kv.Value.AsString() == eventID && strings.HasPrefix(s.Name(), "deliver ") {
				sc := s.SpanContext()
				return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
			}
		}
	}
	t.Fatalf("no deliver span of %s was started", eventID)
	return ""
}

// storedPayloads returns the payloads an outbox file (not in use) holds.
func storedPayloads(t *testing.T, path string) [][]byte {
	t.Helper()
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	recs, err := ob.Read(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, r := range recs {
		out = append(out, r.Payload)
	}
	return out
}

// With trace_context: envelope the record stored in the outbox is the
// delivery envelope with the traceparent of its deliver span; a second
// write of the event, with a new span, is the same record and keeps it;
// another payload under the event ID is still a conflict. With the tracer
// on and the setting off, or the setting on and the tracer off, the stored
// bytes are the reliomq v1 envelope.
func TestTheEnvelopeStoresItsTraceContextAndARewriteIsTheSameRecord(t *testing.T) {
	const tracer = "test_recorder: {}"
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	traced, plain := "evt-traced-"+run, "evt-plain-"+run
	path := filepath.Join(t.TempDir(), "outbox.db")
	p := streamtest.StartTraced(t, tracer, outputConf(unreachable, path, "envelope", "delivery", "trace_context", "envelope"))
	for i := 0; i < 2; i++ {
		if err := p.Write(10*time.Second, `{"n":1}`, "n", "a", "id", traced); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if err := p.Write(10*time.Second, `{"n":2}`, "n", "a", "id", traced); err == nil || !strings.Contains(err.Error(), traced) {
		t.Fatalf("another payload under the event ID: %v, want a conflict naming the event", err)
	}
	p.Stop()
	stored := storedPayloads(t, path)
	if len(stored) != 1 {
		t.Fatalf("outbox holds %d records, want 1", len(stored))
	}
	d, err := envelope.DecodeTracedDelivery(stored[0])
	if err != nil || d.EventID != traced || string(d.Payload) != `{"n":1}` {
		t.Fatalf("stored %s: %+v, %v", stored[0], d, err)
	}
	if want := deliverParent(t, traced); d.Trace.Traceparent != want {
		t.Errorf("stored traceparent %q, want the first write's deliver span %q", d.Trace.Traceparent, want)
	}
	if _, err := envelope.DecodeDelivery(stored[0]); !errors.Is(err, envelope.ErrTraceContext) {
		t.Errorf("a strict v1 decoder reads the traced record: %v", err)
	}

	plainPath := filepath.Join(t.TempDir(), "outbox.db")
	p = streamtest.StartTraced(t, tracer, outputConf(unreachable, plainPath, "envelope", "delivery"))
	if err := p.Write(10*time.Second, `{"n":1}`, "n", "a", "id", plain); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	deliverParent(t, plain) // the tracer was on
	want, _ := envelope.EncodeDelivery(plain, []byte(`{"n":1}`))
	if got := storedPayloads(t, plainPath); len(got) != 1 || string(got[0]) != string(want) {
		t.Errorf("with trace_context off the record is %q, want the v1 bytes %s", got, want)
	}

	// The setting on and the tracer off: no span, nothing added.
	untracedPath := filepath.Join(t.TempDir(), "outbox.db")
	p = streamtest.Start(t, outputConf(unreachable, untracedPath, "envelope", "delivery", "trace_context", "envelope"))
	if err := p.Write(10*time.Second, `{"n":1}`, "n", "a", "id", plain); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	if got := storedPayloads(t, untracedPath); len(got) != 1 || string(got[0]) != string(want) {
		t.Errorf("with the tracer off the record is %q, want the v1 bytes %s", got, want)
	}
}
