package prommetrics

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// With naming: prometheus, counters end in _total, milliseconds and
// nanoseconds are exported as seconds, our metrics carry their HELP, and
// `promtool check metrics` finds nothing to complain about; the default
// keeps Benthos's names.
func TestPrometheusNamingMode(t *testing.T) {
	record := func(e *exporter) {
		e.NewCounterCtor("reliable_mqtt_out_confirmed", "label")("out").Incr(3)
		e.NewGaugeCtor("reliable_mqtt_out_oldest_pending_age_ms", "label")("out").Set(1500)
		e.NewTimerCtor("reliable_mqtt_out_confirm_latency_ns", "label")("out").Timing(2e9)
	}

	e := newTestExporter(t, `naming: prometheus`)
	record(e)
	fams := scrape(t, e)
	out := map[string]string{"label": "out"}
	if v := metric(t, fams, "reliable_mqtt_out_confirmed_total", dto.MetricType_COUNTER, out).GetCounter().GetValue(); v != 3 {
		t.Errorf("reliable_mqtt_out_confirmed_total = %v, want 3", v)
	}
	if h := fams["reliable_mqtt_out_confirmed_total"].GetHelp(); h != metricHelp["reliable_mqtt_out_confirmed"] {
		t.Errorf("HELP %q, want the metric's description", h)
	}
	if v := metric(t, fams, "reliable_mqtt_out_oldest_pending_age_seconds", dto.MetricType_GAUGE, out).GetGauge().GetValue(); v != 1.5 {
		t.Errorf("reliable_mqtt_out_oldest_pending_age_seconds = %v, want 1.5", v)
	}
	if v := metric(t, fams, "reliable_mqtt_out_confirm_latency_seconds", dto.MetricType_SUMMARY, out).GetSummary().GetSampleSum(); v != 2 {
		t.Errorf("reliable_mqtt_out_confirm_latency_seconds sum = %v, want 2", v)
	}
	if problems := promtoolCheckMetrics(t, e); problems != "" {
		t.Errorf("promtool check metrics:\n%s", problems)
	}

	d := newTestExporter(t, `{}`)
	record(d)
	for _, name := range []string{"reliable_mqtt_out_confirmed", "reliable_mqtt_out_oldest_pending_age_ms", "reliable_mqtt_out_confirm_latency_ns"} {
		if _, ok := scrape(t, d)[name]; !ok {
			t.Errorf("the default naming lost %s", name)
		}
	}
}

// promtoolCheckMetrics runs `promtool check metrics` on e's /metrics text
// and returns what it reports.
func promtoolCheckMetrics(t *testing.T, e *exporter) string {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: tests/run installs Debian's prometheus package, which has it")
	}
	srv := httptest.NewServer(e.HandlerFunc())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, _ := cmd.CombinedOutput()
	return strings.TrimSpace(string(out))
}
