package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// withPrometheus turns a config with `http: enabled: false` into one that
// serves `metrics: prometheus: {}` on addr.
func withPrometheus(t *testing.T, yaml, addr string) string {
	t.Helper()
	const off = "http:\n  enabled: false\n"
	if !strings.Contains(yaml, off) {
		t.Fatalf("config has no %q to replace:\n%s", off, yaml)
	}
	return strings.Replace(yaml, off, fmt.Sprintf("http:\n  address: %s\nmetrics:\n  prometheus: {}\n", addr), 1)
}

// slowPoll is harness.Poll looking every 200 ms, for conditions that cost
// an HTTP request.
func slowPoll(timeout time.Duration, cond func() bool) bool {
	return harness.Poll(timeout, func() bool {
		if cond() {
			return true
		}
		time.Sleep(200 * time.Millisecond)
		return false
	})
}

// A consumer pipeline (reliable_mqtt_in → dedup_ledger → reliable_mqtt_out)
// handles a known stream: 30 events, 10 of them sent twice. Its /metrics,
// read with Prometheus's parser and through a real Prometheus server,
// show exactly that run.
func TestPrometheusMetricsShowAKnownRun(t *testing.T) {
	const unique, dups = 30, 10
	broker := harness.StartMosquitto(t, harness.MosquittoOptions{})
	const clientID = "metrics-relay"
	ledgerSession(t, broker.URL(), clientID)
	var stream []string
	for i := 1; i <= unique; i++ {
		stream = append(stream, fmt.Sprintf("ev-%d", i))
	}
	for i := 1; i <= dups; i++ {
		stream = append(stream, fmt.Sprintf("ev-%d", i*3))
	}
	var events [][]byte
	for _, id := range stream {
		events = append(events, ledgerEvent(id))
	}
	harness.Publish(t, broker.URL(), "events/in", events) // queued in the session

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(t)))
	relay := ledgerRelay{inURL: broker.URL(), outURL: broker.URL(), clientID: clientID, dbPath: "relay.db", withLedger: true, outbox: true}
	harness.RunPipeline(t, withPrometheus(t, relay.yaml(), addr), harness.ProcOptions{})
	prom := harness.StartPrometheus(t, addr, time.Second)

	endpoint := "http://" + addr + "/metrics"
	var fams map[string]*dto.MetricFamily
	var lastErr error
	sum := func(name string) float64 {
		v, _ := harness.MetricSum(fams, name, nil)
		return v
	}
	if !slowPoll(60*time.Second, func() bool {
		fams, lastErr = harness.ScrapeMetrics(endpoint)
		return lastErr == nil && sum("reliable_mqtt_in_acked") >= unique+dups && sum("reliable_mqtt_out_confirmed") >= unique && sum("reliable_mqtt_out_pending") == 0
	}) {
		t.Fatalf("the run did not finish within 60s (last scrape error: %v): in_acked %v, out_confirmed %v, out_pending %v",
			lastErr, sum("reliable_mqtt_in_acked"), sum("reliable_mqtt_out_confirmed"), sum("reliable_mqtt_out_pending"))
	}
	for _, c := range []struct {
		name string
		typ  dto.MetricType
		want float64
	}{
		{"reliable_mqtt_in_received", dto.MetricType_COUNTER, unique + dups},
		{"reliable_mqtt_in_acked", dto.MetricType_COUNTER, unique + dups},
		{"dedup_ledger_passed", dto.MetricType_COUNTER, unique},
		{"dedup_ledger_duplicates", dto.MetricType_COUNTER, dups},
		{"dedup_ledger_keys", dto.MetricType_GAUGE, unique},
		{"reliable_mqtt_out_confirmed", dto.MetricType_COUNTER, unique},
		{"reliable_mqtt_out_pending", dto.MetricType_GAUGE, 0},
		{"reliable_mqtt_out_pending_bytes", dto.MetricType_GAUGE, 0},
	} {
		fam, ok := fams[c.name]
		if !ok {
			t.Errorf("/metrics has no %s", c.name)
			continue
		}
		if fam.GetType() != c.typ || fam.GetHelp() == "" {
			t.Errorf("%s: TYPE %s, HELP %q; want TYPE %s and a HELP line", c.name, fam.GetType(), fam.GetHelp(), c.typ)
		}
		if got := sum(c.name); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	// Benthos's labels come through: the input's metrics carry its path.
	if _, ok := harness.MetricSum(fams, "reliable_mqtt_in_acked", map[string]string{"path": "root.input"}); !ok {
		t.Errorf("reliable_mqtt_in_acked has no sample with path=root.input")
	}
	if fam := fams["reliable_mqtt_out_confirm_latency_ns"]; fam.GetType() != dto.MetricType_SUMMARY || fam.GetMetric()[0].GetSummary().GetSampleCount() != unique {
		t.Errorf("reliable_mqtt_out_confirm_latency_ns: %v", fam)
	}

	// The same numbers as Prometheus stores them, through its HTTP API.
	for expr, want := range map[string]float64{
		`sum(reliable_mqtt_out_confirmed{job="reliable-mqtt"})`: unique,
		`sum(dedup_ledger_duplicates)`:                          dups,
		`sum(reliable_mqtt_in_acked)`:                           unique + dups,
		`sum(reliable_mqtt_out_pending)`:                        0,
		`up{job="reliable-mqtt"}`:                               1,
	} {
		var got float64
		var ok bool
		if !slowPoll(60*time.Second, func() bool {
			got, ok, lastErr = prom.Query(expr)
			return ok && got == want
		}) {
			t.Errorf("Prometheus: %s = %v (present %v, error %v), want %v", expr, got, ok, lastErr, want)
		}
	}
}

// Metrics reach a real Pushgateway every push_interval while the process
// runs, and once more when it stops.
func TestPushgatewayReceivesPeriodicAndFinalPushes(t *testing.T) {
	gw := harness.StartPushgateway(t)
	config := func(instance, interval, input string) string {
		return fmt.Sprintf(`
http: {enabled: false}
input:
  generate: %s
output:
  drop: {}
metrics:
  prometheus:
    push_url: %s
    push_interval: %s
    push_grouping: {instance: %s}
`, input, gw.URL, interval, instance)
	}
	received := func(instance string) (v float64, pushedAt float64, ok bool) {
		fams, err := harness.ScrapeMetrics(gw.URL + "/metrics")
		if err != nil {
			return 0, 0, false
		}
		match := map[string]string{"job": "reliable-mqtt", "instance": instance}
		v, ok = harness.MetricSum(fams, "input_received", match)
		pushedAt, _ = harness.MetricSum(fams, "push_time_seconds", match)
		return v, pushedAt, ok
	}

	// Periodic: two pushes, with growing counts, while it runs.
	p := harness.RunPipeline(t, config("edge-1", "300ms", `{interval: 20ms, mapping: 'root = "x"'}`), harness.ProcOptions{})
	var first, firstAt float64
	if !slowPoll(30*time.Second, func() bool {
		v, at, ok := received("edge-1")
		first, firstAt = v, at
		return ok && v > 0
	}) {
		t.Fatal("no push from the running process reached the Pushgateway within 30s")
	}
	if !slowPoll(30*time.Second, func() bool {
		v, at, ok := received("edge-1")
		return ok && v > first && at > firstAt
	}) {
		t.Fatal("the Pushgateway got no second, newer push within 30s")
	}
	if !p.Running() {
		t.Fatal("the process stopped")
	}

	// Final: a one-hour interval never fires; what arrives is the push at
	// shutdown, after the input's 7 messages.
	p2 := harness.RunPipeline(t, config("edge-2", "1h", `{count: 7, interval: "", mapping: 'root = "x"'}`), harness.ProcOptions{})
	if code, err := p2.Wait(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("the run of 7 messages: exit %d, %v", code, err)
	}
	if v, _, ok := received("edge-2"); !ok || v != 7 {
		t.Fatalf("after shutdown the Pushgateway holds input_received %v (present %v) for edge-2, want 7", v, ok)
	}
}

// In streams mode each stream's metrics carry its name in a `stream` label.
func TestPrometheusStreamLabelInStreamsMode(t *testing.T) {
	dir := t.TempDir()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(t)))
	root := filepath.Join(dir, "root.yaml")
	stream := filepath.Join(dir, "sensors.yaml")
	if err := os.WriteFile(root, []byte(fmt.Sprintf("http:\n  address: %s\nmetrics:\n  prometheus: {}\n", addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stream, []byte("input:\n  generate: {interval: 50ms, mapping: 'root = \"x\"'}\noutput:\n  drop: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(harness.Binary(t), "streams", "-o", root, stream)
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	var got float64
	if !slowPoll(30*time.Second, func() bool {
		fams, err := harness.ScrapeMetrics("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		got, _ = harness.MetricSum(fams, "input_received", map[string]string{"stream": "sensors"})
		return got > 0
	}) {
		t.Fatalf("no input_received{stream=\"sensors\"} > 0 at /metrics within 30s (last %v)", got)
	}
}
