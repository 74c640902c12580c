package tracing

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

func recorder() (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	return rec, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value.String()
		}
	}
	return ""
}

func TestTheReceivedSpanIsAChildOfTheSentSpanInOneTrace(t *testing.T) {
	rec, tp := recorder()
	d := NewDeliveries(tp, "publisher")
	in := &mqttmsg.Properties{User: []mqttmsg.UserProperty{{Key: "site", Value: "a"}, {Key: KeyTraceparent, Value: "stale"}}}
	props := Inject(d.Start(context.Background(), "ev-1", "reliable/ingress"), in)
	if len(in.User) != 2 || in.User[1].Value != "stale" {
		t.Fatalf("Start modified the caller's properties: %+v", in.User)
	}
	var parents int
	for _, u := range props.User {
		if u.Key == KeyTraceparent {
			parents++
		}
	}
	if parents != 1 || props.User[0].Key != "site" {
		t.Fatalf("want site and one traceparent, got %+v", props.User)
	}

	r := NewReceives(tp, "bridge")
	ctx := r.Start(context.Background(), FromProperties(props), "ev-1", "reliable/ingress")
	// Benthos ends the input's spans before the acknowledgement: that must
	// not end the attempt's span.
	trace.SpanFromContext(ctx).End()
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans ended before the acknowledgement", n)
	}
	SetOutcome(ctx, DuplicateDrop, nil)
	r.End(ctx, nil)
	d.OnEventPublished("ev-1")
	d.OnEventConfirmed("ev-1")

	ended := rec.Ended()
	if len(ended) != 2 {
		t.Fatalf("want 2 ended spans, got %d", len(ended))
	}
	recv, sent := ended[0], ended[1]
	if recv.SpanContext().TraceID() != sent.SpanContext().TraceID() || recv.Parent().SpanID() != sent.SpanContext().SpanID() {
		t.Errorf("receive span %v (parent %v) is not a child of the sent span %v", recv.SpanContext(), recv.Parent(), sent.SpanContext())
	}
	if got := attr(recv, AttrOutcome); got != DuplicateDrop {
		t.Errorf("receive outcome %q, want %q (set by the ledger, kept at the acknowledgement)", got, DuplicateDrop)
	}
	if got := attr(sent, AttrOutcome); got != Confirmed {
		t.Errorf("sent outcome %q, want %q", got, Confirmed)
	}
	if attr(sent, AttrEventID) != "ev-1" || attr(sent, AttrHop) != "publisher" || attr(sent, AttrOutboxWait) == "" {
		t.Errorf("sent span lacks event_id, hop or outbox wait: %v", sent.Attributes())
	}
}

func TestARetriedRecordAndAFailedAttemptSaySo(t *testing.T) {
	rec, tp := recorder()
	d := NewDeliveries(tp, "out")
	d.Start(context.Background(), "a", "t")
	d.OnEventPublished("a")
	d.OnEventPublished("a")
	d.OnEventConfirmed("a")
	d.Start(context.Background(), "b", "t")
	d.Done("b", errors.New("permanent failure: too large"))
	r := NewReceives(tp, "in")
	r.End(r.Start(context.Background(), envelope.TraceContext{}, "c", "t"), errors.New("ledger down"))

	ended := rec.Ended()
	if len(ended) != 3 {
		t.Fatalf("want 3 spans, got %d", len(ended))
	}
	if attr(ended[0], AttrAttempts) != "2" || attr(ended[0], AttrOutcome) != Confirmed {
		t.Errorf("a: %v", ended[0].Attributes())
	}
	if attr(ended[1], AttrOutcome) != Refused {
		t.Errorf("b: %v", ended[1].Attributes())
	}
	if attr(ended[2], AttrOutcome) != Retried {
		t.Errorf("c: %v", ended[2].Attributes())
	}
}

func TestWithTheTracerOffNothingChanges(t *testing.T) {
	tp := noop.NewTracerProvider()
	if NewDeliveries(tp, "x") != nil || NewReceives(tp, "x") != nil {
		t.Fatal("a no-op provider must give nil trackers")
	}
	var d *Deliveries
	p := &mqttmsg.Properties{ContentType: "a"}
	if got := d.Start(context.Background(), "e", "t"); got != nil {
		t.Errorf("Start with the tracer off gave a span context: %v", trace.SpanContextFromContext(got))
	}
	d.OnEventPublished("e")
	d.OnEventConfirmed("e")
	d.Close()
	if Inject(context.Background(), p) != p {
		t.Error("Inject without a span context must return p itself")
	}
}

func TestTwoWritesOfOneEventDifferOnlyInTraceContext(t *testing.T) {
	_, tp := recorder()
	d := NewDeliveries(tp, "out")
	base := &mqttmsg.Properties{User: []mqttmsg.UserProperty{{Key: "site", Value: "a"}}}
	p1 := Inject(d.Start(context.Background(), "e1", "t"), base)
	p2 := Inject(d.Start(context.Background(), "e2", "t"), base)
	if v1, _ := p1.Get(KeyTraceparent); v1 == "" || v1 == func() string { v, _ := p2.Get(KeyTraceparent); return v }() {
		t.Fatalf("two spans must give two traceparents: %+v, %+v", p1, p2)
	}
	if !SameProps(p1, p2) {
		t.Error("records differing only in traceparent must be the same record")
	}
	if SameProps(p1, &mqttmsg.Properties{User: []mqttmsg.UserProperty{{Key: "site", Value: "b"}}}) {
		t.Error("records with different user properties must differ")
	}
	onlyTrace := Inject(d.Start(context.Background(), "e3", "t"), nil)
	if onlyTrace == nil || !SameProps(onlyTrace, nil) || !SameProps(nil, &mqttmsg.Properties{}) {
		t.Error("a record with only a trace context must equal one without properties")
	}
}

func TestADeadLetterSaysSoAndWhy(t *testing.T) {
	rec, tp := recorder()
	d := NewDeliveries(tp, "dead-letter")
	d.Start(context.Background(), "e", "reliable/dead-letter")
	d.DeadLetter("e", "permanent failure: too large")
	d.Done("e", nil)
	s := rec.Ended()[0]
	if attr(s, AttrOutcome) != DeadLettered || attr(s, AttrReason) != "permanent failure: too large" {
		t.Errorf("dead letter span: %v", s.Attributes())
	}
}
