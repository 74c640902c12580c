package mqttconf

import (
	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/conffield"
)

// The trace context setting both plugins take: the same name and values on
// both sides of a topic.
const (
	FieldTraceContext      = "trace_context"
	TraceContextProperties = "properties"
	TraceContextEnvelope   = "envelope"
)

// TraceContextField declares trace_context; use says what `envelope` does
// in the component.
func TraceContextField(use string) *service.ConfigField {
	return service.NewStringAnnotatedEnumField(FieldTraceContext, map[string]string{
		TraceContextProperties: "MQTT 5 user properties only. On MQTT 3.1.1 a message carries no trace context, and the reliomq v1 envelopes are exactly reliomq v1's bytes.",
		TraceContextEnvelope:   "Also as the keys `traceparent` and `tracestate` of the reliomq v1 ingress or delivery envelope, on either protocol version: the way to keep one trace per event over MQTT 3.1.1. " + use,
	}).Description("Where the W3C trace context (`traceparent`, `tracestate`) of an event travels, with a `tracer` on (docs/operations.md, \"Tracing an event\"). `envelope` is an extension of reliomq v1 for chains of reliable-mqtt processes only: a reliomq v1 peer refuses the extra keys. Set it on the receiving `reliable_mqtt_in` first (it then accepts envelopes with and without a trace context), then on the sending `reliable_mqtt_out`; a receiver without it refuses such an envelope as malformed, with an error that names this setting.").
		Default(TraceContextProperties).Advanced()
}

// ParseTraceContext reports whether trace_context is envelope.
func ParseTraceContext(pc *service.ParsedConfig) (bool, error) {
	v, err := conffield.FieldEnum(pc, FieldTraceContext, TraceContextProperties, TraceContextEnvelope)
	return v == TraceContextEnvelope, err
}
