package mqttin

import (
	"errors"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/inbox"
	"github.com/reliable-mqtt/reliable-mqtt/internal/tracing"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/mqttconf"
)

func traceContextField() *service.ConfigField {
	return mqttconf.TraceContextField("Here: an envelope may carry them (`envelope: ingress` or `delivery`); a `traceparent` that is not W3C version 00 makes the envelope malformed, and each delivery attempt's span is a child of the one it carries, so the event keeps its trace, and a bridge's `reliable_mqtt_out` with `trace_context: envelope` passes it on. Without it (the default) an envelope that carries them is malformed, as every key reliomq v1 does not know.")
}

// parseTraceContext reads trace_context: true for envelope, which needs
// a reliomq v1 envelope to read it from.
func parseTraceContext(conf *service.ParsedConfig, env string) (bool, error) {
	on, err := mqttconf.ParseTraceContext(conf)
	if err != nil || !on {
		return false, err
	}
	if env != envelopeIngress && env != envelopeDelivery {
		return false, errors.New("trace_context: envelope needs envelope: ingress or delivery, the reliomq v1 envelopes that carry it")
	}
	return true, nil
}

// traceParent is the trace context d's span continues: its envelope's
// (trace_context: envelope), else its MQTT 5 user properties'.
func traceParent(d *inbox.Delivery) envelope.TraceContext {
	if d.Decoded != nil && d.Decoded.Trace.Traceparent != "" {
		return d.Decoded.Trace
	}
	return tracing.FromProperties(d.Msg.Properties())
}
