// Package prommetrics is the `prometheus` metrics exporter: every Benthos
// metric and ours, in the Prometheus text format on Benthos's HTTP server
// (`/metrics`), and optionally pushed to a Pushgateway. The registry and the
// push loop are internal/promexport; this package is the Benthos glue.
package prommetrics

import (
	"context"
	"fmt"
	"net/http"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/promexport"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/conffield"
)

const (
	fieldUseHistogramTiming = "use_histogram_timing"
	fieldHistogramBuckets   = "histogram_buckets"
	fieldAddProcessMetrics  = "add_process_metrics"
	fieldAddGoMetrics       = "add_go_metrics"
	fieldPushURL            = "push_url"
	fieldPushInterval       = "push_interval"
	fieldPushJobName        = "push_job_name"
	fieldPushGrouping       = "push_grouping"
	fieldNaming             = "naming"

	namingBenthos    = "benthos"
	namingPrometheus = "prometheus"
)

func spec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Summary("Serves every metric in the Prometheus text format at `/metrics` on the HTTP server, and optionally pushes them to a Pushgateway.").
		Description(`
Counters and gauges keep their names; timers (such as ` + "`output_latency_ns`" + `) become summaries of nanoseconds (quantiles 0.5, 0.9, 0.99), or with ` + "`use_histogram_timing`" + ` histograms of seconds. Benthos's labels (` + "`label`" + `, ` + "`path`" + `, and ` + "`stream`" + ` in streams mode) and the plugins' own (` + "`reason`" + `) become Prometheus labels. A character Prometheus does not allow in a name becomes ` + "`_`" + `.

The endpoint is Benthos's HTTP server (` + "`http.address`" + `, default ` + "`0.0.0.0:4195`" + `), which must be enabled. A device that cannot be scraped (behind NAT) sets ` + "`push_url`" + `: the metrics are then also pushed every ` + "`push_interval`" + ` and once more at shutdown.`).
		Field(service.NewStringAnnotatedEnumField(fieldNaming, map[string]string{
			namingBenthos:    "Benthos's names, unchanged: what Benthos and Redpanda Connect dashboards expect.",
			namingPrometheus: "Prometheus's conventions: counters end in `_total`; a metric in milliseconds or nanoseconds (`_ms`, `_ns`) is exported in seconds as `_seconds` (timers too); our own metrics get a HELP text saying what they count. The alert rules in `resources/prometheus/` work with both.",
		}).Description("How metrics are named.").Default(namingBenthos).Advanced()).
		Field(service.NewBoolField(fieldUseHistogramTiming).
			Description("Export timers as histograms (in seconds) instead of summaries (in nanoseconds).").
			Default(false).Advanced()).
		Field(service.NewFloatListField(fieldHistogramBuckets).
			Description("Bucket upper bounds in seconds for histogram timers; empty means Prometheus's defaults (5 ms to 10 s).").
			Default([]any{}).Advanced()).
		Field(service.NewBoolField(fieldAddProcessMetrics).
			Description("Also export the process's CPU, memory and file descriptor metrics (`process_*`).").
			Default(false).Advanced()).
		Field(service.NewBoolField(fieldAddGoMetrics).
			Description("Also export the Go runtime's metrics (`go_*`).").
			Default(false).Advanced()).
		Field(service.NewURLField(fieldPushURL).
			Description("A Pushgateway to push to, e.g. `http://pushgateway:9091`. Empty: no push.").
			Default("").Advanced()).
		Field(service.NewDurationField(fieldPushInterval).
			Description("How often to push when `push_url` is set.").
			Default("10s").Advanced()).
		Field(service.NewStringField(fieldPushJobName).
			Description("The `job` label of pushed metrics.").
			Default("reliable-mqtt").Advanced()).
		Field(service.NewStringMapField(fieldPushGrouping).
			Description("More grouping labels of pushed metrics. Devices sharing a job need one that tells them apart (e.g. `instance: ${HOSTNAME}`), or each push replaces the other's.").
			Default(map[string]any{}).Advanced())
}

func init() {
	service.MustRegisterMetricsExporter("prometheus", spec(), newExporter)
}

// exporter adapts a promexport.Exporter to service.MetricsExporter.
type exporter struct{ x *promexport.Exporter }

func newExporter(conf *service.ParsedConfig, log *service.Logger) (service.MetricsExporter, error) {
	var c promexport.Config
	err := conffield.Read(conf,
		conffield.Bool(&c.Histogram, fieldUseHistogramTiming), conffield.FloatList(&c.Buckets, fieldHistogramBuckets),
		conffield.Bool(&c.ProcessMetrics, fieldAddProcessMetrics), conffield.Bool(&c.GoMetrics, fieldAddGoMetrics),
		conffield.String(&c.PushURL, fieldPushURL), conffield.Duration(&c.PushInterval, fieldPushInterval),
		conffield.String(&c.PushJob, fieldPushJobName), conffield.StringMap(&c.PushGrouping, fieldPushGrouping))
	if err != nil {
		return nil, err
	}
	naming, err := conffield.FieldEnum(conf, fieldNaming, namingBenthos, namingPrometheus)
	if err != nil {
		return nil, fmt.Errorf("prometheus: %w", err)
	}
	if naming == namingPrometheus {
		c.PrometheusNames, c.Help = true, metricHelp
	}
	x, err := promexport.New(c, log)
	if err != nil {
		return nil, err
	}
	return &exporter{x: x}, nil
}

// HandlerFunc is what Benthos serves at /metrics (and /stats).
func (e *exporter) HandlerFunc() http.HandlerFunc { return e.x.Handler().ServeHTTP }

func (e *exporter) Close(ctx context.Context) error { return e.x.Close(ctx) }

func (e *exporter) NewCounterCtor(name string, labelKeys ...string) service.MetricsExporterCounterCtor {
	mk := e.x.Counter(name, labelKeys)
	return func(labelValues ...string) service.MetricsExporterCounter { return mk(labelValues...) }
}

func (e *exporter) NewGaugeCtor(name string, labelKeys ...string) service.MetricsExporterGaugeCtor {
	mk := e.x.Gauge(name, labelKeys)
	return func(labelValues ...string) service.MetricsExporterGauge { return mk(labelValues...) }
}

func (e *exporter) NewTimerCtor(name string, labelKeys ...string) service.MetricsExporterTimerCtor {
	mk := e.x.Timer(name, labelKeys)
	return func(labelValues ...string) service.MetricsExporterTimer { return mk(labelValues...) }
}
