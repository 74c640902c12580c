package mqttout

import (
	"context"
	"errors"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/trace"

	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sender"
	"github.com/reliable-mqtt/reliable-mqtt/internal/tracing"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/mqttconf"
)

// traceContextNeedsEnvelope is why trace_context: envelope is refused
// without a v1 envelope (the lint rule says the same).
const traceContextNeedsEnvelope = "trace_context: envelope needs a reliomq v1 envelope to carry it: envelope: delivery, or confirm: end_to_end without envelope: properties"

func traceContextField() *service.ConfigField {
	return mqttconf.TraceContextField("Here: the trace context of each record's `deliver` span is written into the envelope stored in the outbox (so a resend after a restart carries it too) and published; a write of an event ID already pending is the same record when only its trace context differs. Needs `envelope: delivery`, or `confirm: end_to_end` without `envelope: properties`. A trace context that would take a payload beyond `max_payload_bytes` is left out; with the tracer off nothing is added.")
}

// parseTraceContext reads trace_context: true for envelope, which needs
// records that are v1 envelopes.
func parseTraceContext(conf *service.ParsedConfig, env string, endToEnd bool) (bool, error) {
	on, err := mqttconf.ParseTraceContext(conf)
	if err != nil || !on {
		return false, err
	}
	if !(codec.Encoding{Mode: env, EndToEnd: endToEnd}).Enveloped() {
		return false, errors.New(traceContextNeedsEnvelope)
	}
	return true, nil
}

// metaFallbackError is set by Benthos's fallback output on a message it
// hands to its next output: here, a dead letter.
const metaFallbackError = "fallback_error"

// traced is the sender's Metrics with the record spans' events.
type traced struct {
	*metrics
	*tracing.Deliveries
}

// senderMetrics is what the sender reports to: the metrics, and the spans
// when a tracer is on.
func (o *output) senderMetrics() sender.Metrics {
	if o.spans == nil {
		return o.m
	}
	return traced{o.m, o.spans}
}

// traceStart opens rec's span as a child of msg's and stores its trace
// context with the record: on MQTT 5 as user properties, with
// trace_context: envelope in the envelope; a message that could not become
// a record (err) gets a closed span that says why.
func (o *output) traceStart(msg *service.Message, rec *mqttmsg.Event, err error) {
	if o.spans == nil {
		return
	}
	if err != nil {
		o.spans.Refused(msg.Context(), err)
		return
	}
	if ctx := o.spans.Start(msg.Context(), rec.EventID, rec.Topic); ctx != nil {
		if o.s.sender.Client.ProtocolVersion == mqttclient.V5 {
			rec.Props = tracing.Inject(ctx, rec.Props)
		}
		o.traceInEnvelope(ctx, rec)
	}
	if reason, ok := msg.MetaGet(metaFallbackError); ok {
		o.spans.DeadLetter(rec.EventID, reason)
	}
}

// traceWritten closes (direct mode: confirmed or failed) or marks stored
// (outbox mode) the span of each record written.
func (o *output) traceWritten(recs []mqttmsg.Event, errs []error, direct bool) {
	if o.spans == nil {
		return
	}
	for i, rec := range recs {
		if rec.EventID == "" {
			continue
		}
		if direct || errs[i] != nil {
			o.spans.Done(rec.EventID, errs[i])
		} else {
			o.spans.Stored(rec.EventID)
		}
	}
}

// traceInEnvelope writes the trace context of the span in ctx into rec's
// envelope (trace_context: envelope). One that does not fit stays out: an
// event is never refused for its trace context.
func (o *output) traceInEnvelope(ctx context.Context, rec *mqttmsg.Event) {
	tc := tracing.ContextOf(ctx)
	enc := o.out.Encoding()
	if !enc.TraceContext || tc.Traceparent == "" {
		return
	}
	added, err := enc.AddTraceContext(rec, tc)
	switch {
	case err != nil:
		trace.SpanFromContext(ctx).AddEvent("trace context not carried: " + err.Error())
	case !added:
		trace.SpanFromContext(ctx).AddEvent("trace context not carried: the payload would exceed max_payload_bytes")
	}
}
