// Package otelcollector is the `open_telemetry_collector` tracer: spans
// exported over OTLP (HTTP and/or gRPC) to OpenTelemetry collectors, such as
// Jaeger. Its fields are those of Redpanda Connect's tracer of that name, so
// a Connect config's tracer section works unchanged. This package is the
// Benthos glue; what a span of ours says is internal/tracing.
package otelcollector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/conffield"
)

const (
	fieldService    = "service"
	fieldHTTP       = "http"
	fieldGRPC       = "grpc"
	fieldAddress    = "address"
	fieldSecure     = "secure"
	fieldTags       = "tags"
	fieldSampling   = "sampling"
	fieldSamplingOn = "enabled"
	fieldRatio      = "ratio"
)

// flushEvery is how often the batch processor exports what it holds: spans
// reach the collector while the process runs, not only at shutdown.
const flushEvery = 2 * time.Second

// exportTimeout bounds one export, so a collector that went away holds up
// neither the pipeline (the batch processor drops spans when its queue is
// full) nor shutdown.
const exportTimeout = 5 * time.Second

func tracerSpec() *service.ConfigSpec {
	collector := func(what, example string) []*service.ConfigField {
		return []*service.ConfigField{
			service.NewStringField(fieldAddress).Description("The endpoint of a collector to send spans to, `host:port`.").Example(example),
			service.NewBoolField(fieldSecure).Description("Connect to the collector with TLS (" + what + ").").Default(false),
		}
	}
	return service.NewConfigSpec().
		Stable().
		Summary("Sends spans to OpenTelemetry collectors (for example Jaeger) over OTLP, HTTP or gRPC.").
		Description(`
The fields are those of Redpanda Connect's tracer of the same name, so a Connect config's `+"`tracer`"+` section works unchanged.

Spans are exported in batches every 2 seconds while the process runs, and the last batch at shutdown (bounded: an unreachable collector delays shutdown by at most 5 seconds). A collector that is down costs spans, never messages: the exporter drops what it cannot send.

With `+"`reliable_mqtt_out`"+` and `+"`reliable_mqtt_in`"+` on MQTT 5 one event is one trace across every hop: the output stores the W3C `+"`traceparent`"+` (and `+"`tracestate`"+`) user properties with the outbox record, and the input makes the message's span a child of the `+"`traceparent`"+` it receives. See docs/operations.md, "Tracing an event".`).
		Fields(
			service.NewStringField(fieldService).Description("The name of the service in traces.").Default("benthos"),
			service.NewObjectListField(fieldHTTP, collector("HTTPS", "localhost:4318")...).Description("Collectors to send spans to over OTLP/HTTP.").Default([]any{}),
			service.NewObjectListField(fieldGRPC, collector("gRPC over TLS", "localhost:4317")...).Description("Collectors to send spans to over OTLP/gRPC.").Default([]any{}),
			service.NewStringMapField(fieldTags).Description("Attributes added to every span's resource.").Default(map[string]any{}).Advanced(),
			service.NewObjectField(fieldSampling,
				service.NewBoolField(fieldSamplingOn).Description("Sample a share of traces instead of every one.").Default(false),
				service.NewFloatField(fieldRatio).Description("The share of traces to sample, 0 to 1. A message that arrives with a `traceparent` follows its parent's decision, so one event's trace is kept whole or not at all.").Examples(0.85, 0.5).Optional(),
			).Description("Settings for trace sampling. Sampling is recommended for high-volume production workloads."),
		)
}

func init() {
	service.MustRegisterOtelTracerProvider("open_telemetry_collector", tracerSpec(),
		func(conf *service.ParsedConfig) (trace.TracerProvider, error) {
			return newProvider(context.Background(), conf)
		})
}

func newProvider(ctx context.Context, conf *service.ParsedConfig) (trace.TracerProvider, error) {
	var name string
	var tags map[string]string
	if err := conffield.Read(conf, conffield.String(&name, fieldService), conffield.StringMap(&tags, fieldTags)); err != nil {
		return nil, err
	}
	sampler, err := parseSampler(conf.Namespace(fieldSampling))
	if err != nil {
		return nil, err
	}
	var exporters []sdktrace.SpanExporter
	for _, transport := range []string{fieldHTTP, fieldGRPC} {
		list, err := conf.FieldObjectList(transport)
		if err != nil {
			return nil, err
		}
		for _, c := range list {
			exp, err := newExporter(ctx, transport, c)
			if err != nil {
				return nil, err
			}
			exporters = append(exporters, exp)
		}
	}

	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	for k, v := range tags {
		attrs = append(attrs, attribute.String(k, v))
	}
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(resource.NewWithAttributes("", attrs...)),
		sdktrace.WithSampler(sampler),
	}
	for _, exp := range exporters {
		opts = append(opts, sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(flushEvery), sdktrace.WithExportTimeout(exportTimeout)))
	}
	return &provider{TracerProvider: sdktrace.NewTracerProvider(opts...)}, nil
}

// parseSampler: every trace without sampling; with it, the ratio for the
// traces that start here and the parent's decision for the rest.
func parseSampler(conf *service.ParsedConfig) (sdktrace.Sampler, error) {
	on, err := conf.FieldBool(fieldSamplingOn)
	if err != nil || !on {
		return sdktrace.AlwaysSample(), err
	}
	if !conf.Contains(fieldRatio) {
		return nil, errors.New("sampling.enabled is true but sampling.ratio is not set: set a share of traces between 0 and 1 (e.g. 0.01)")
	}
	ratio, err := conf.FieldFloat(fieldRatio)
	if err != nil {
		return nil, err
	}
	if ratio < 0 || ratio > 1 {
		return nil, fmt.Errorf("sampling.ratio %v is not a share between 0 and 1", ratio)
	}
	return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
}

func newExporter(ctx context.Context, transport string, c *service.ParsedConfig) (sdktrace.SpanExporter, error) {
	var addr string
	var secure bool
	if err := conffield.Read(c, conffield.String(&addr, fieldAddress), conffield.Bool(&secure, fieldSecure)); err != nil {
		return nil, err
	}
	if addr == "" {
		return nil, fmt.Errorf("%s: a collector needs an address (host:port)", transport)
	}
	// The exporters connect lazily: a collector that is not up yet fails
	// exports (spans are dropped), never the start of the pipeline.
	if transport == fieldHTTP {
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(addr), otlptracehttp.WithTimeout(exportTimeout)}
		if !secure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		return otlptracehttp.New(ctx, opts...)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(addr), otlptracegrpc.WithTimeout(exportTimeout)}
	if !secure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	return otlptracegrpc.New(ctx, opts...)
}

// provider bounds the shutdown Benthos calls at exit (with a context that
// has no deadline): the last batch is exported, or dropped after a while.
type provider struct {
	*sdktrace.TracerProvider
}

// Shutdown flushes the spans still held and stops the exporters.
func (p *provider) Shutdown(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, shutdown.Send)
	defer cancel()
	return p.TracerProvider.Shutdown(ctx)
}
