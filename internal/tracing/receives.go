package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
)

// Receives start the span of each delivery attempt a receiving hop hands
// to its pipeline: a child of the traceparent the message carries (the
// sending hop's span), so the event keeps one trace ID across hops and
// Benthos's tracing_id() reads the same at both ends. Benthos takes the
// span as the input's own (it starts none for a message that has one).
type Receives struct {
	tracer trace.Tracer
	hop    string
}

// NewReceives returns the span starter of the receiving hop named hop; nil
// when tp records nothing. A nil *Receives starts no span and leaves the
// context as it is (a received trace context goes no further: nothing
// records it here).
func NewReceives(tp trace.TracerProvider, hop string) *Receives {
	if !On(tp) {
		return nil
	}
	return &Receives{tracer: tp.Tracer(scope), hop: hop}
}

// Start returns ctx with the span of one delivery attempt of eventID
// ("" when the message has none), received on topic with the trace context
// parent (from its user properties or its envelope; zero: none).
func (r *Receives) Start(ctx context.Context, parent envelope.TraceContext, eventID, topic string) context.Context {
	if r == nil {
		return ctx
	}
	ctx = Extract(ctx, parent)
	_, span := r.tracer.Start(ctx, "receive "+topic, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(AttrEventID.String(eventID), AttrTopic.String(topic), AttrHop.String(r.hop)))
	return trace.ContextWithSpan(ctx, heldSpan{span})
}

// heldSpan is a span that only End of this package ends: Benthos ends the
// input's spans before it runs the acknowledgement, but the attempt's span
// covers the acknowledgement too (the end-to-end ACK publish, the broker's
// PUBACK) and its outcome.
type heldSpan struct{ trace.Span }

// End does nothing: Receives.End ends the span.
func (heldSpan) End(...trace.SpanEndOption) {}

// End closes the attempt's span in ctx once the pipeline settled it:
// acknowledged when result is nil, else retried (delivered again). An
// outcome set on the way (a duplicate dropped) is kept.
func (r *Receives) End(ctx context.Context, result error) {
	if r == nil {
		return
	}
	held, ok := trace.SpanFromContext(ctx).(heldSpan)
	if !ok {
		return
	}
	span := held.Span
	if result != nil {
		end(span, Retried, result)
		return
	}
	if !hasOutcome(span) {
		span.SetAttributes(AttrOutcome.String(Acknowledged))
	}
	span.End()
}

// hasOutcome reports whether span already says what became of the event
// (the SDK's spans show their attributes; others are taken to have none).
func hasOutcome(span trace.Span) bool {
	ro, ok := span.(interface{ Attributes() []attribute.KeyValue })
	if !ok {
		return false
	}
	for _, kv := range ro.Attributes() {
		if kv.Key == AttrOutcome {
			return true
		}
	}
	return false
}
