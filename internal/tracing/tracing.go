// Package tracing follows one event across MQTT hops in OpenTelemetry
// traces, without Benthos: the W3C trace context (`traceparent`,
// `tracestate`) carried as MQTT 5 user properties (or, opted in, as keys of
// a reliomq v1 envelope: internal/envelope), the span a receiving hop
// starts as a child of it, and the span a sending hop keeps open from the
// write until the record's confirmation.
//
// With the tracer off (a no-op provider) nothing here changes a record or
// allocates a span: the properties of a publish stay exactly as they were.
package tracing

import (
	"context"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// User property names of the W3C trace context (the envelope's keys too).
const (
	KeyTraceparent = envelope.KeyTraceparent
	KeyTracestate  = envelope.KeyTracestate
)

// Span attribute keys: what an operator searches for in a trace.
const (
	AttrEventID    = attribute.Key("event_id")
	AttrTopic      = attribute.Key("messaging.destination.name")
	AttrHop        = attribute.Key("reliable_mqtt.hop")
	AttrOutcome    = attribute.Key("reliable_mqtt.outcome")
	AttrOutboxWait = attribute.Key("reliable_mqtt.outbox_wait_ms")
	AttrAttempts   = attribute.Key("reliable_mqtt.attempts")
	AttrReason     = attribute.Key("reliable_mqtt.reason")
)

// Outcomes, the values of AttrOutcome.
const (
	Confirmed      = "confirmed"           // the PUBACK or end-to-end ACK arrived
	Retried        = "retried"             // not confirmed in this attempt; it will come again
	DuplicateDrop  = "duplicate dropped"   // a ledger found the event already applied
	DeadLettered   = "dead-lettered"       // written to a dead-letter output
	Refused        = "refused"             // an output refused it for good (a permanent failure)
	Acknowledged   = "acknowledged"        // the pipeline acknowledged a received message
	PendingAtClose = "pending at shutdown" // still unconfirmed when the output closed
)

var propagator = propagation.TraceContext{}

// On reports whether tp records anything: false for Benthos's default
// tracer (`none`), whose spans cost nothing and carry no context.
func On(tp trace.TracerProvider) bool {
	_, off := tp.(noop.TracerProvider)
	return tp != nil && !off
}

// ContextOf returns the W3C trace context of the span in ctx, as a hop
// sends it on; zero when ctx carries no valid span context.
func ContextOf(ctx context.Context) envelope.TraceContext {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return envelope.TraceContext{}
	}
	carrier := propagation.MapCarrier{}
	propagator.Inject(ctx, carrier)
	return envelope.TraceContext{Traceparent: carrier.Get(KeyTraceparent), Tracestate: carrier.Get(KeyTracestate)}
}

// FromProperties returns the trace context p's user properties carry (the
// last of each key); zero when none.
func FromProperties(p *mqttmsg.Properties) envelope.TraceContext {
	var tc envelope.TraceContext
	if p == nil {
		return tc
	}
	for _, u := range p.User {
		switch u.Key {
		case KeyTraceparent:
			tc.Traceparent = u.Value
		case KeyTracestate:
			tc.Tracestate = u.Value
		}
	}
	return tc
}

// Inject returns p with the trace context of ctx as user properties
// (replacing any traceparent or tracestate already there), p itself when
// ctx carries no valid span context. p is not modified.
func Inject(ctx context.Context, p *mqttmsg.Properties) *mqttmsg.Properties {
	tc := ContextOf(ctx)
	if tc.Traceparent == "" {
		return p
	}
	out := &mqttmsg.Properties{}
	if p != nil {
		*out = *p
	}
	out.User = slices.DeleteFunc(slices.Clone(out.User), isTraceKey)
	out.User = append(out.User, mqttmsg.UserProperty{Key: KeyTraceparent, Value: tc.Traceparent})
	if tc.Tracestate != "" {
		out.User = append(out.User, mqttmsg.UserProperty{Key: KeyTracestate, Value: tc.Tracestate})
	}
	return out
}

// Extract returns ctx with the remote span context of tc (received in user
// properties or in an envelope), ctx itself when tc is zero or invalid.
func Extract(ctx context.Context, tc envelope.TraceContext) context.Context {
	if tc == (envelope.TraceContext{}) {
		return ctx
	}
	carrier := propagation.MapCarrier{}
	for k, v := range map[string]string{KeyTraceparent: tc.Traceparent, KeyTracestate: tc.Tracestate} {
		if v != "" {
			carrier[k] = v
		}
	}
	return propagator.Extract(ctx, carrier)
}

func isTraceKey(u mqttmsg.UserProperty) bool {
	return u.Key == KeyTraceparent || u.Key == KeyTracestate
}

// WithoutContext returns p without its trace context, for comparing two
// writes of one event: the traceparent differs on every write, the event
// does not. nil when nothing else is left.
func WithoutContext(p *mqttmsg.Properties) *mqttmsg.Properties {
	if p == nil || !slices.ContainsFunc(p.User, isTraceKey) {
		return p
	}
	out := *p
	out.User = slices.DeleteFunc(slices.Clone(p.User), isTraceKey)
	if empty(&out) {
		return nil
	}
	return &out
}

// SetOutcome records what became of the event on the span in ctx (a
// no-op without a recording span): a ledger dropping a duplicate, an
// output dead-lettering it.
func SetOutcome(ctx context.Context, outcome string, reason error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrOutcome.String(outcome))
	if reason != nil {
		span.SetAttributes(AttrReason.String(reason.Error()))
	}
}

// end closes span with outcome; err (a failure) marks the span an error.
func end(span trace.Span, outcome string, err error) {
	span.SetAttributes(AttrOutcome.String(outcome))
	if err != nil {
		span.SetAttributes(AttrReason.String(err.Error()))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
