package prommetrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redpanda-data/benthos/v4/public/service"
)

func newTestExporter(t *testing.T, yaml string) *exporter {
	t.Helper()
	conf, err := spec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := newExporter(conf, service.MockResources().Logger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m.(*exporter)
}

// scrape fetches /metrics as Prometheus would and parses it with
// Prometheus's own text parser.
func scrape(t *testing.T, e *exporter) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(e.HandlerFunc())
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); expfmt.ResponseFormat(resp.Header).FormatType() != expfmt.TypeTextPlain {
		t.Fatalf("Content-Type %q is not the text format", ct)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("Prometheus's parser rejects /metrics: %v", err)
	}
	return fams
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// metric returns the one sample of fam whose labels are exactly want.
func metric(t *testing.T, fams map[string]*dto.MetricFamily, name string, typ dto.MetricType, want map[string]string) *dto.Metric {
	t.Helper()
	fam, ok := fams[name]
	if !ok {
		t.Fatalf("no metric family %s", name)
	}
	if fam.GetType() != typ {
		t.Fatalf("%s is a %s, want %s", name, fam.GetType(), typ)
	}
	if fam.GetHelp() == "" {
		t.Errorf("%s has no HELP", name)
	}
	for _, m := range fam.GetMetric() {
		got := labelsOf(m)
		if len(got) != len(want) {
			continue
		}
		same := true
		for k, v := range want {
			if got[k] != v {
				same = false
			}
		}
		if same {
			return m
		}
	}
	t.Fatalf("%s has no sample with labels %v", name, want)
	return nil
}

func TestCountersGaugesAndSummariesWithLabels(t *testing.T) {
	e := newTestExporter(t, `{}`)

	acks := e.NewCounterCtor("reliable_mqtt_out_acks_ignored", "label", "path", "reason")
	acks("out", "root.output", "malformed").Incr(2)
	acks("out", "root.output", "malformed").Incr(3)
	acks("out", "root.output", "unknown").Incr(1)
	acks("out", "root.output", "unknown").Incr(-4) // ignored, not a panic
	pending := e.NewGaugeCtor("reliable_mqtt_out_pending")
	pending().Set(500)
	pending().Set(42)
	e.NewGaugeCtor("ratio")().(interface{ SetFloat64(float64) }).SetFloat64(0.25)
	lat := e.NewTimerCtor("reliable_mqtt_out_confirm_latency_ns", "label")
	for _, ns := range []int64{1000, 2000, 3000} {
		lat("out").Timing(ns)
	}

	e.NewCounterCtor("never_counted") // a family without a sample is not shown

	fams := scrape(t, e)
	if _, ok := fams["never_counted"]; ok {
		t.Error("a counter that never counted is exported")
	}
	if v := metric(t, fams, "reliable_mqtt_out_acks_ignored", dto.MetricType_COUNTER,
		map[string]string{"label": "out", "path": "root.output", "reason": "malformed"}).GetCounter().GetValue(); v != 5 {
		t.Errorf("acks_ignored{reason=malformed} = %v, want 5", v)
	}
	if v := metric(t, fams, "reliable_mqtt_out_acks_ignored", dto.MetricType_COUNTER,
		map[string]string{"label": "out", "path": "root.output", "reason": "unknown"}).GetCounter().GetValue(); v != 1 {
		t.Errorf("acks_ignored{reason=unknown} = %v, want 1", v)
	}
	if v := metric(t, fams, "reliable_mqtt_out_pending", dto.MetricType_GAUGE, nil).GetGauge().GetValue(); v != 42 {
		t.Errorf("pending = %v, want 42", v)
	}
	if v := metric(t, fams, "ratio", dto.MetricType_GAUGE, nil).GetGauge().GetValue(); v != 0.25 {
		t.Errorf("ratio = %v, want 0.25", v)
	}
	s := metric(t, fams, "reliable_mqtt_out_confirm_latency_ns", dto.MetricType_SUMMARY, map[string]string{"label": "out"}).GetSummary()
	if s.GetSampleCount() != 3 || s.GetSampleSum() != 6000 {
		t.Errorf("summary count %d sum %v, want 3 and 6000 (nanoseconds)", s.GetSampleCount(), s.GetSampleSum())
	}
	if len(s.GetQuantile()) != 3 {
		t.Errorf("summary has %d quantiles, want 3", len(s.GetQuantile()))
	}
}

func TestHistogramTimingIsInSeconds(t *testing.T) {
	e := newTestExporter(t, `
use_histogram_timing: true
histogram_buckets: [0.001, 0.01, 1]
`)
	lat := e.NewTimerCtor("processor_latency_ns")
	lat().Timing(5_000_000)   // 5 ms
	lat().Timing(500_000_000) // 0.5 s
	h := metric(t, scrape(t, e), "processor_latency_ns", dto.MetricType_HISTOGRAM, nil).GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() != 0.505 {
		t.Fatalf("histogram count %d sum %v, want 2 and 0.505 s", h.GetSampleCount(), h.GetSampleSum())
	}
	want := map[float64]uint64{0.001: 0, 0.01: 1, 1: 2}
	for _, b := range h.GetBucket() {
		if w, ok := want[b.GetUpperBound()]; ok && b.GetCumulativeCount() != w {
			t.Errorf("bucket le=%v holds %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), w)
		}
	}
}

// Benthos asks for a name once per component; the second ask must share
// the family, and an ask with other labels must not break the endpoint.
func TestRepeatedAndConflictingNames(t *testing.T) {
	e := newTestExporter(t, `{}`)
	a := e.NewCounterCtor("input_received", "label", "path")
	b := e.NewCounterCtor("input_received", "label", "path")
	a("in", "root.input").Incr(1)
	b("in", "root.input").Incr(1)
	e.NewCounterCtor("input_received", "other")("x").Incr(7) // dropped
	e.NewGaugeCtor("input_received")().Set(9)                // dropped
	e.NewCounterCtor("weird.name-1", "a-b")("v").Incr(1)     // sanitised

	fams := scrape(t, e)
	if v := metric(t, fams, "input_received", dto.MetricType_COUNTER, map[string]string{"label": "in", "path": "root.input"}).GetCounter().GetValue(); v != 2 {
		t.Errorf("input_received = %v, want 2", v)
	}
	if n := len(fams["input_received"].GetMetric()); n != 1 {
		t.Errorf("input_received has %d samples, want 1", n)
	}
	metric(t, fams, "weird_name_1", dto.MetricType_COUNTER, map[string]string{"a_b": "v"})
}

func TestProcessAndGoMetrics(t *testing.T) {
	fams := scrape(t, newTestExporter(t, `
add_process_metrics: true
add_go_metrics: true
`))
	for _, name := range []string{"process_resident_memory_bytes", "go_goroutines"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("no %s", name)
		}
	}
	if _, ok := scrape(t, newTestExporter(t, `{}`))["go_goroutines"]; ok {
		t.Error("go_goroutines exported without add_go_metrics")
	}
}

func TestBadConfigIsRefused(t *testing.T) {
	for _, yaml := range []string{
		`histogram_buckets: [1, 0.5]`,
		`{push_url: "http://127.0.0.1:1", push_interval: 0s}`,
	} {
		conf, err := spec().ParseYAML(yaml, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := newExporter(conf, service.MockResources().Logger()); err == nil {
			t.Errorf("%s: accepted", yaml)
		}
	}
}
