// Package promexport keeps metrics in a Prometheus registry of its own:
// families created on first use under names mangled into Prometheus's legacy
// character set, timers as summaries (nanoseconds) or histograms (seconds),
// and an optional periodic push to a Pushgateway. It knows nothing of
// Benthos; plugin/prommetrics adapts it to Benthos's MetricsExporter.
package promexport

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/push"
	"github.com/reliable-mqtt/reliable-mqtt/internal/periodic"
)

// pushTimeout bounds one push, so a dead Pushgateway delays neither the
// next push nor Close by more than this.
const pushTimeout = 10 * time.Second

// Config says what the registry exports and where it pushes.
type Config struct {
	Histogram      bool      // timers as histograms of seconds, not summaries of nanoseconds
	Buckets        []float64 // histogram bounds in seconds; empty: Prometheus's defaults
	ProcessMetrics bool
	GoMetrics      bool

	// PrometheusNames exports Prometheus's naming conventions instead of
	// Benthos's names: counters end in _total, and a metric in
	// milliseconds or nanoseconds (_ms, _ns) becomes _seconds, its values
	// converted. Off by default, so dashboards built on Benthos names keep
	// working.
	PrometheusNames bool
	// Help is the HELP text of a metric by its Benthos name; a metric
	// without one gets "Benthos metric <name>".
	Help map[string]string

	PushURL      string // empty: no push
	PushInterval time.Duration
	PushJob      string
	PushGrouping map[string]string
}

// Logger receives the warnings of metrics that cannot be exported and of
// failed pushes.
type Logger interface {
	Warnf(format string, args ...any)
}

// Exporter is a registry of its own and, with a PushURL, its push loop.
type Exporter struct {
	cfg        Config
	log        Logger
	reg        *prometheus.Registry
	mu         sync.Mutex
	collectors map[string]*collector // by sanitised name

	pusher   *push.Pusher
	stopPush chan struct{}
	pushDone chan struct{}
	close    sync.Once
}

// collector is one registered metric family.
type collector struct {
	kind   string // "counter", "gauge" or "timer"
	labels []string
	vec    prometheus.Collector // *prometheus.CounterVec, *GaugeVec, *HistogramVec or *SummaryVec
}

// New checks c and starts the push loop when c.PushURL is set.
func New(c Config, log Logger) (*Exporter, error) {
	if len(c.Buckets) == 0 {
		c.Buckets = prometheus.DefBuckets
	}
	if !slices.IsSorted(c.Buckets) {
		return nil, fmt.Errorf("prometheus: histogram_buckets must be in increasing order, got %v", c.Buckets)
	}
	if c.PushURL != "" && c.PushInterval <= 0 {
		return nil, fmt.Errorf("prometheus: push_interval must be positive, got %s", c.PushInterval)
	}
	e := &Exporter{cfg: c, log: log, reg: prometheus.NewRegistry(), collectors: map[string]*collector{}}
	if c.ProcessMetrics {
		e.reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if c.GoMetrics {
		e.reg.MustRegister(collectors.NewGoCollector())
	}
	if c.PushURL != "" {
		e.startPush()
	}
	return e, nil
}

// startPush starts the periodic push.
func (e *Exporter) startPush() {
	e.pusher = push.New(e.cfg.PushURL, e.cfg.PushJob).Gatherer(e.reg)
	for _, k := range slices.Sorted(maps.Keys(e.cfg.PushGrouping)) {
		e.pusher = e.pusher.Grouping(k, e.cfg.PushGrouping[k])
	}
	e.stopPush, e.pushDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(e.pushDone)
		periodic.Run(e.stopPush, e.cfg.PushInterval, func() {
			if err := e.push(context.Background()); err != nil {
				e.log.Warnf("%v", err)
			}
		})
	}()
}

func (e *Exporter) push(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	if err := e.pusher.PushContext(ctx); err != nil {
		return fmt.Errorf("prometheus: pushing metrics to %s failed: %w", e.cfg.PushURL, err)
	}
	return nil
}

// Handler serves the registry in the Prometheus text format.
func (e *Exporter) Handler() http.Handler {
	return promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{})
}

// Close stops pushing after one last push, so the Pushgateway keeps the
// final values.
func (e *Exporter) Close(ctx context.Context) error {
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

// family returns, as a function of label values, the children of family n:
// the collector mk makes on first use, each child as wrap makes it.
// Benthos asks for the same name once per component; a name asked for
// again with another kind or other labels cannot share the family, and is
// refused (once warned): its children are nil, and what wrap makes of a nil
// child swallows the values.
func family[V interface {
	prometheus.Collector
	WithLabelValues(...string) C
}, C, M any](e *Exporter, kind, n string, labels []string, mk func(name string, labels []string) V, wrap func(C) M) func(labelValues ...string) M {
	vec, ok := e.register(kind, n, labels, func(n string, ls []string) prometheus.Collector { return mk(n, ls) }).(V)
	return func(labelValues ...string) M {
		var child C
		if ok {
			child = vec.WithLabelValues(labelValues...)
		}
		return wrap(child)
	}
}

// register returns the collector registered under n, creating it with mk
// on first use; nil when n is refused (see family).
func (e *Exporter) register(kind, n string, labels []string, mk func(name string, labels []string) prometheus.Collector) prometheus.Collector {
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

func (e *Exporter) help(name string) string {
	if h, ok := e.cfg.Help[name]; ok {
		return h
	}
	return "Benthos metric " + name
}

// exported is the name a metric of kind is exported under, and the factor
// that converts its values (1 unless a unit changes).
func (e *Exporter) exported(kind, name string) (string, float64) {
	n := promName(name)
	if !e.cfg.PrometheusNames {
		return n, 1
	}
	switch {
	case kind == "counter":
		if !strings.HasSuffix(n, "_total") {
			n += "_total"
		}
		return n, 1
	case strings.HasSuffix(n, "_ms"):
		return strings.TrimSuffix(n, "_ms") + "_seconds", 1e-3
	case strings.HasSuffix(n, "_ns"):
		return strings.TrimSuffix(n, "_ns") + "_seconds", 1e-9
	}
	return n, 1
}

// Counter is what a counter family hands out per label values.
type Counter interface {
	Incr(n int64)
	IncrFloat64(n float64)
}

// Gauge is what a gauge family hands out per label values.
type Gauge interface {
	Set(v int64)
	SetFloat64(v float64)
}

// Timer is what a timer family hands out per label values.
type Timer interface {
	Timing(ns int64)
}

// Counter returns the counter family name with the label keys.
func (e *Exporter) Counter(name string, labelKeys []string) func(labelValues ...string) Counter {
	n, _ := e.exported("counter", name)
	return family(e, "counter", n, labelKeys, func(n string, ls []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: n, Help: e.help(name)}, ls)
	}, func(c prometheus.Counter) Counter { return counter{c} })
}

// Gauge returns the gauge family name with the label keys.
func (e *Exporter) Gauge(name string, labelKeys []string) func(labelValues ...string) Gauge {
	n, scale := e.exported("gauge", name)
	return family(e, "gauge", n, labelKeys, func(n string, ls []string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: n, Help: e.help(name)}, ls)
	}, func(g prometheus.Gauge) Gauge { return gauge{g: g, scale: scale} })
}

// Timer returns the timer family name with the label keys.
func (e *Exporter) Timer(name string, labelKeys []string) func(labelValues ...string) Timer {
	n, scale := e.exported("timer", name)
	if e.cfg.PrometheusNames {
		scale = 1e-9 // base units: seconds, whatever the name said
	}
	if e.cfg.Histogram {
		return family(e, "timer", n, labelKeys, func(n string, ls []string) *prometheus.HistogramVec {
			return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: n, Help: e.help(name) + " (seconds)", Buckets: e.cfg.Buckets}, ls)
		}, func(o prometheus.Observer) Timer { return timer{obs: o, scale: 1e-9} })
	}
	unit := " (nanoseconds)"
	if e.cfg.PrometheusNames {
		unit = " (seconds)"
	}
	return family(e, "timer", n, labelKeys, func(n string, ls []string) *prometheus.SummaryVec {
		return prometheus.NewSummaryVec(prometheus.SummaryOpts{
			Name: n, Help: e.help(name) + unit,
			Objectives: map[float64]float64{0.5: 0.05, 0.9: 0.01, 0.99: 0.001},
		}, ls)
	}, func(o prometheus.Observer) Timer { return timer{obs: o, scale: scale} })
}

// The children handed out; a nil child (a refused family's) swallows the
// values.

type counter struct{ c prometheus.Counter }

// A Prometheus counter panics on a negative increment; Benthos never sends
// one, and a bug elsewhere must not crash the process through its metrics.
func (c counter) Incr(n int64) { c.IncrFloat64(float64(n)) }
func (c counter) IncrFloat64(n float64) {
	if n > 0 && c.c != nil {
		c.c.Add(n)
	}
}

type gauge struct {
	g     prometheus.Gauge
	scale float64 // the Benthos unit to the exported one
}

func (g gauge) Set(v int64) { g.SetFloat64(float64(v)) }
func (g gauge) SetFloat64(v float64) {
	if g.g != nil {
		g.g.Set(v * g.scale)
	}
}

type timer struct {
	obs   prometheus.Observer
	scale float64 // nanoseconds to the exported unit
}

func (t timer) Timing(ns int64) {
	if t.obs != nil {
		t.obs.Observe(float64(ns) * t.scale)
	}
}
