package mqttout

import (
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sender"
	"github.com/reliable-mqtt/reliable-mqtt/internal/tracing"
)

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

// traceStart opens rec's span as a child of msg's and, on MQTT 5, stores
// its trace context with the record as user properties; a message that
// could not become a record (err) gets a closed span that says why.
func (o *output) traceStart(msg *service.Message, rec *codec.Message, err error) {
	if o.spans == nil {
		return
	}
	if err != nil {
		o.spans.Refused(msg.Context(), err)
		return
	}
	rec.Props = o.spans.Start(msg.Context(), rec.EventID, rec.Topic, rec.Props, o.s.client.ProtocolVersion == mqttclient.V5)
	if reason, ok := msg.MetaGet(metaFallbackError); ok {
		o.spans.DeadLetter(rec.EventID, reason)
	}
}

// traceWritten closes (direct mode: confirmed or failed) or marks stored
// (outbox mode) the span of each record written.
func (o *output) traceWritten(recs []codec.Message, errs []error, direct bool) {
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
