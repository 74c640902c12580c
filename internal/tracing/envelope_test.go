package tracing

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
)

// On 3.1.1 with trace_context: envelope the sending hop's span context
// rides in the envelope: what ContextOf gives is a valid envelope trace
// context (tracestate included), and the receiving hop's span, started
// from the decoded envelope, is a child of the sending hop's span.
func TestAnEnvelopeCarriesTheSpanToTheNextHop(t *testing.T) {
	rec, tp := recorder()
	state, err := trace.ParseTraceState("vendor=abc,other=1")
	if err != nil {
		t.Fatal(err)
	}
	upstream := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled, TraceState: state, Remote: true,
	}))
	d := NewDeliveries(tp, "publisher")
	tc := ContextOf(d.Start(upstream, "ev-1", "reliable/ingress"))
	if err := envelope.CheckTraceContext(tc); err != nil || tc.Tracestate != "vendor=abc,other=1" {
		t.Fatalf("ContextOf = %+v (%v): want a valid traceparent and the upstream tracestate", tc, err)
	}
	env, err := envelope.EncodeIngress("ev-1", "dest", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if env, err = envelope.AddTraceContext(env, tc); err != nil {
		t.Fatal(err)
	}
	in, err := envelope.DecodeTracedIngress(env)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReceives(tp, "bridge")
	r.End(r.Start(context.Background(), in.Trace, in.EventID, "reliable/ingress"), nil)
	d.OnEventConfirmed("ev-1")

	ended := rec.Ended()
	if len(ended) != 2 {
		t.Fatalf("want 2 ended spans, got %d", len(ended))
	}
	recv, sent := ended[0], ended[1]
	if sent.SpanContext().TraceID() != (trace.TraceID{1, 2, 3}) || recv.SpanContext().TraceID() != sent.SpanContext().TraceID() || recv.Parent().SpanID() != sent.SpanContext().SpanID() {
		t.Errorf("receive span %v (parent %v) is not a child of the sent span %v in the upstream trace", recv.SpanContext(), recv.Parent(), sent.SpanContext())
	}
	if got := recv.SpanContext().TraceState().String(); got != "vendor=abc,other=1" {
		t.Errorf("the receive span's tracestate %q, want the one the envelope carried", got)
	}
	if ContextOf(context.Background()) != (envelope.TraceContext{}) {
		t.Error("ContextOf without a span must be zero")
	}
}
