// Package prommetrics is the `prometheus` metrics exporter: every Benthos
// metric and ours, in the Prometheus text format on Benthos's HTTP server
// (`/metrics`), and optionally pushed to a Pushgateway.
package prommetrics

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/push"
	"github.com/redpanda-data/benthos/v4/public/service"
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
)

// pushTimeout bounds one push, so a dead Pushgateway delays neither the
// next push nor Close by more than this.
const pushTimeout = 10 * time.Second

func spec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Summary("Serves every metric in the Prometheus text format at `/metrics` on the HTTP server, and optionally pushes them to a Pushgateway.").
		Description(`
Counters and gauges keep their names; timers (such as ` + "`output_latency_ns`" + `) become summaries of nanoseconds (quantiles 0.5, 0.9, 0.99), or with ` + "`use_histogram_timing`" + ` histograms of seconds. Benthos's labels (` + "`label`" + `, ` + "`path`" + `, and ` + "`stream`" + ` in streams mode) and the plugins' own (` + "`reason`" + `) become Prometheus labels. A character Prometheus does not allow in a name becomes ` + "`_`" + `.

The endpoint is Benthos's HTTP server (` + "`http.address`" + `, default ` + "`0.0.0.0:4195`" + `), which must be enabled. A device that cannot be scraped (behind NAT) sets ` + "`push_url`" + `: the metrics are then also pushed every ` + "`push_interval`" + ` and once more at shutdown.`).
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

// exporter implements service.MetricsExporter on a registry of its own.
type exporter struct {
	log        *service.Logger
	reg        *prometheus.Registry
	histogram  bool
	buckets    []float64
	mu         sync.Mutex
	collectors map[string]*collector // by sanitised name

	pusher   *push.Pusher
	pushURL  string
	stopPush chan struct{}
	pushDone chan struct{}
	close    sync.Once
}

// collector is one registered metric family.
type collector struct {
	kind   string // "counter", "gauge" or "timer"
	labels []string
	vec    any // *prometheus.CounterVec, *GaugeVec, *HistogramVec or *SummaryVec
}

func newExporter(conf *service.ParsedConfig, log *service.Logger) (service.MetricsExporter, error) {
	e := &exporter{log: log, reg: prometheus.NewRegistry(), collectors: map[string]*collector{}}
	var err error
	if e.histogram, err = conf.FieldBool(fieldUseHistogramTiming); err != nil {
		return nil, err
	}
	if e.buckets, err = conf.FieldFloatList(fieldHistogramBuckets); err != nil {
		return nil, err
	}
	if len(e.buckets) == 0 {
		e.buckets = prometheus.DefBuckets
	}
	if !slices.IsSorted(e.buckets) {
		return nil, fmt.Errorf("prometheus: %s must be in increasing order, got %v", fieldHistogramBuckets, e.buckets)
	}
	if on, err := conf.FieldBool(fieldAddProcessMetrics); err != nil {
		return nil, err
	} else if on {
		e.reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if on, err := conf.FieldBool(fieldAddGoMetrics); err != nil {
		return nil, err
	} else if on {
		e.reg.MustRegister(collectors.NewGoCollector())
	}
	if err := e.startPush(conf); err != nil {
		return nil, err
	}
	return e, nil
}

// startPush starts the periodic push when push_url is set.
func (e *exporter) startPush(conf *service.ParsedConfig) error {
	u, err := conf.FieldString(fieldPushURL)
	if err != nil || u == "" {
		return err
	}
	interval, err := conf.FieldDuration(fieldPushInterval)
	if err != nil {
		return err
	}
	if interval <= 0 {
		return fmt.Errorf("prometheus: %s must be positive, got %s", fieldPushInterval, interval)
	}
	job, err := conf.FieldString(fieldPushJobName)
	if err != nil {
		return err
	}
	grouping, err := conf.FieldStringMap(fieldPushGrouping)
	if err != nil {
		return err
	}
	e.pushURL = u
	e.pusher = push.New(u, job).Gatherer(e.reg)
	for _, k := range slices.Sorted(maps.Keys(grouping)) {
		e.pusher = e.pusher.Grouping(k, grouping[k])
	}
	e.stopPush, e.pushDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(e.pushDone)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-e.stopPush:
				return
			case <-t.C:
				if err := e.push(context.Background()); err != nil {
					e.log.Warnf("%v", err)
				}
			}
		}
	}()
	return nil
}

func (e *exporter) push(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	if err := e.pusher.PushContext(ctx); err != nil {
		return fmt.Errorf("prometheus: pushing metrics to %s failed: %w", e.pushURL, err)
	}
	return nil
}

// HandlerFunc is what Benthos serves at /metrics (and /stats).
func (e *exporter) HandlerFunc() http.HandlerFunc {
	return promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}).ServeHTTP
}

// Close stops pushing after one last push, so the Pushgateway keeps the
// final values.
func (e *exporter) Close(ctx context.Context) error {
	var err error
	e.close.Do(func() {
		if e.pusher == nil {
			return
		}
		close(e.stopPush)
		<-e.pushDone
		err = e.push(ctx)
	})
	return err
}

var invalidName = regexp.MustCompile(`[^a-zA-Z0-9_:]`)

// promName maps a Benthos metric or label name into Prometheus's legacy
// character set, which every scraper and Pushgateway accepts.
func promName(s string) string {
	s = invalidName.ReplaceAllString(s, "_")
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		s = "_" + s
	}
	return s
}

// family returns the collector registered under name, creating it with mk
// on first use. Benthos asks for the same name once per component; a name
// asked for again with another kind or other labels cannot share the
// family, and gets nil (its values are dropped, once warned).
func (e *exporter) family(kind, name string, labels []string, mk func(name string, labels []string) prometheus.Collector) any {
	n := promName(name)
	ls := make([]string, len(labels))
	for i, l := range labels {
		ls[i] = promName(l)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c, ok := e.collectors[n]; ok {
		if c.kind != kind || !slices.Equal(c.labels, ls) {
			e.log.Warnf("prometheus: metric %s is already a %s with labels %v; its use as a %s with labels %v is not exported", n, c.kind, c.labels, kind, ls)
			return nil
		}
		return c.vec
	}
	vec := mk(n, ls)
	if err := e.reg.Register(vec); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			e.log.Warnf("prometheus: metric %s is not exported: %v", n, err)
			return nil
		}
	}
	e.collectors[n] = &collector{kind: kind, labels: ls, vec: vec}
	return vec
}

func help(name string) string { return "Benthos metric " + name }

func (e *exporter) NewCounterCtor(name string, labelKeys ...string) service.MetricsExporterCounterCtor {
	vec, _ := e.family("counter", name, labelKeys, func(n string, ls []string) prometheus.Collector {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: n, Help: help(name)}, ls)
	}).(*prometheus.CounterVec)
	return func(labelValues ...string) service.MetricsExporterCounter {
		if vec == nil {
			return dud{}
		}
		return counter{vec.WithLabelValues(labelValues...)}
	}
}

func (e *exporter) NewGaugeCtor(name string, labelKeys ...string) service.MetricsExporterGaugeCtor {
	vec, _ := e.family("gauge", name, labelKeys, func(n string, ls []string) prometheus.Collector {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: n, Help: help(name)}, ls)
	}).(*prometheus.GaugeVec)
	return func(labelValues ...string) service.MetricsExporterGauge {
		if vec == nil {
			return dud{}
		}
		return gauge{vec.WithLabelValues(labelValues...)}
	}
}

func (e *exporter) NewTimerCtor(name string, labelKeys ...string) service.MetricsExporterTimerCtor {
	if e.histogram {
		vec, _ := e.family("timer", name, labelKeys, func(n string, ls []string) prometheus.Collector {
			return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: n, Help: help(name) + " (seconds)", Buckets: e.buckets}, ls)
		}).(*prometheus.HistogramVec)
		return func(labelValues ...string) service.MetricsExporterTimer {
			if vec == nil {
				return dud{}
			}
			return timer{obs: vec.WithLabelValues(labelValues...), scale: 1e-9}
		}
	}
	vec, _ := e.family("timer", name, labelKeys, func(n string, ls []string) prometheus.Collector {
		return prometheus.NewSummaryVec(prometheus.SummaryOpts{
			Name: n, Help: help(name) + " (nanoseconds)",
			Objectives: map[float64]float64{0.5: 0.05, 0.9: 0.01, 0.99: 0.001},
		}, ls)
	}).(*prometheus.SummaryVec)
	return func(labelValues ...string) service.MetricsExporterTimer {
		if vec == nil {
			return dud{}
		}
		return timer{obs: vec.WithLabelValues(labelValues...), scale: 1}
	}
}

type counter struct{ c prometheus.Counter }

// A Prometheus counter panics on a negative increment; Benthos never sends
// one, and a bug elsewhere must not crash the process through its metrics.
func (c counter) Incr(n int64) { c.IncrFloat64(float64(n)) }
func (c counter) IncrFloat64(n float64) {
	if n > 0 {
		c.c.Add(n)
	}
}

type gauge struct{ g prometheus.Gauge }

func (g gauge) Set(v int64)          { g.g.Set(float64(v)) }
func (g gauge) SetFloat64(v float64) { g.g.Set(v) }

type timer struct {
	obs   prometheus.Observer
	scale float64 // nanoseconds to the exported unit
}

func (t timer) Timing(ns int64) { t.obs.Observe(float64(ns) * t.scale) }

// dud swallows the values of a metric that could not be registered.
type dud struct{}

func (dud) Incr(int64)          {}
func (dud) IncrFloat64(float64) {}
func (dud) Set(int64)           {}
func (dud) SetFloat64(float64)  {}
func (dud) Timing(int64)        {}
