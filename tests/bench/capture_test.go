package bench

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// The output's own metrics are the only precise view of what it confirmed
// and how long each confirmation took, so the benchmarks read them through
// a metrics exporter of their own, selected per stream by an id.

const (
	metricConfirmed = "reliable_mqtt_out_confirmed"
	metricLatency   = "reliable_mqtt_out_confirm_latency_ns"
	metricWindow    = "reliable_mqtt_out_window"
)

// capture collects one stream's confirmed count and confirmation latencies.
type capture struct {
	confirmed atomic.Int64
	windowMax atomic.Int64 // the largest window the sender reported

	mu        sync.Mutex
	latencies []int64
}

var (
	capturesMu sync.Mutex
	captures   = map[string]*capture{}
)

// newCapture registers a capture under id for a stream's metrics config:
// `bench_capture: { id: <id> }`.
func newCapture(id string) *capture {
	c := &capture{}
	capturesMu.Lock()
	captures[id] = c
	capturesMu.Unlock()
	return c
}

func init() {
	spec := service.NewConfigSpec().Field(service.NewStringField("id"))
	err := service.RegisterMetricsExporter("bench_capture", spec, func(conf *service.ParsedConfig, _ *service.Logger) (service.MetricsExporter, error) {
		id, err := conf.FieldString("id")
		if err != nil {
			return nil, err
		}
		capturesMu.Lock()
		c := captures[id]
		capturesMu.Unlock()
		if c == nil {
			c = &capture{} // a stream nobody watches
		}
		return c, nil
	})
	if err != nil {
		panic(err)
	}
}

// waitConfirmed waits until n records are confirmed; false at timeout.
func (c *capture) waitConfirmed(n int64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for c.confirmed.Load() < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// percentiles of the recorded latencies, in milliseconds.
func (c *capture) percentiles() (p50, p99 float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return percentilesMs(c.latencies)
}

func percentilesMs(ns []int64) (p50, p99 float64) {
	if len(ns) == 0 {
		return 0, 0
	}
	s := append([]int64(nil), ns...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) float64 { return float64(s[int(q*float64(len(s)-1))]) / 1e6 }
	return at(0.50), at(0.99)
}

func (c *capture) NewCounterCtor(name string, _ ...string) service.MetricsExporterCounterCtor {
	return func(...string) service.MetricsExporterCounter {
		if name == metricConfirmed {
			return counterFunc(func(n int64) { c.confirmed.Add(n) })
		}
		return counterFunc(func(int64) {})
	}
}

func (c *capture) NewTimerCtor(name string, _ ...string) service.MetricsExporterTimerCtor {
	return func(...string) service.MetricsExporterTimer {
		if name == metricLatency {
			return timerFunc(func(d int64) {
				c.mu.Lock()
				c.latencies = append(c.latencies, d)
				c.mu.Unlock()
			})
		}
		return timerFunc(func(int64) {})
	}
}

func (c *capture) NewGaugeCtor(name string, _ ...string) service.MetricsExporterGaugeCtor {
	return func(...string) service.MetricsExporterGauge {
		if name == metricWindow {
			return gaugeFunc(func(v int64) {
				for old := c.windowMax.Load(); v > old && !c.windowMax.CompareAndSwap(old, v); old = c.windowMax.Load() {
				}
			})
		}
		return gaugeFunc(func(int64) {})
	}
}

func (c *capture) Close(context.Context) error { return nil }

type counterFunc func(int64)

func (f counterFunc) Incr(n int64)          { f(n) }
func (f counterFunc) IncrFloat64(n float64) { f(int64(n)) }

type timerFunc func(int64)

func (f timerFunc) Timing(d int64) { f(d) }

type gaugeFunc func(int64)

func (f gaugeFunc) Set(v int64) { f(v) }
