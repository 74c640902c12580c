package harness

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// promStartTimeout bounds how long Prometheus or the Pushgateway may take
// to answer /-/ready.
const promStartTimeout = 60 * time.Second

// PromServer is Debian's prometheus or prometheus-pushgateway, run by the
// test on a free loopback port with its own storage, SIGKILLed at cleanup.
type PromServer struct {
	URL string // http://127.0.0.1:port
}

// StartPrometheus runs Debian's prometheus scraping target (host:port,
// path /metrics) every interval, storing its data in a temp dir.
func StartPrometheus(t testing.TB, target string, interval time.Duration) *PromServer {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "prometheus.yml")
	yml := fmt.Sprintf(`global:
  scrape_interval: %s
  evaluation_interval: %s
scrape_configs:
  - job_name: reliable-mqtt
    static_configs:
      - targets: [ %q ]
`, interval, interval, target)
	if err := os.WriteFile(conf, []byte(yml), 0o644); err != nil {
		t.Fatalf("harness: write %s: %v", conf, err)
	}
	return startProm(t, "prometheus", dir, func(addr string) []string {
		return []string{"--config.file=" + conf, "--storage.tsdb.path=" + filepath.Join(dir, "data"), "--web.listen-address=" + addr}
	})
}

// StartPushgateway runs Debian's prometheus-pushgateway, keeping pushed
// metrics in memory only.
func StartPushgateway(t testing.TB) *PromServer {
	t.Helper()
	return startProm(t, "prometheus-pushgateway", t.TempDir(), func(addr string) []string {
		return []string{"--web.listen-address=" + addr}
	})
}

func startProm(t testing.TB, name, dir string, args func(addr string) []string) *PromServer {
	t.Helper()
	exe, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("harness: %s not found (%v): apt-get install -y %s", name, err, name)
	}
	addr := "127.0.0.1:" + strconv.Itoa(FreePort(t))
	logPath := filepath.Join(dir, name+".log")
	c, err := startChild(exe, args(addr), os.Environ(), dir, logPath, "=== harness: "+name+" ===")
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s, last log lines:\n%s", name, tail(logPath, 40))
		}
		if err := c.kill(); err != nil {
			t.Errorf("harness: stop %s: %v", name, err)
		}
	})
	s := &PromServer{URL: "http://" + addr}
	client := http.Client{Timeout: 2 * time.Second}
	if !Poll(promStartTimeout, func() bool {
		resp, err := client.Get(s.URL + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatalf("harness: %s did not become ready on %s within %s:\n%s", name, addr, promStartTimeout, tail(logPath, 40))
	}
	return s
}

// Query runs an instant PromQL query through Prometheus's HTTP API and
// returns the value of its single sample; ok is false while the result is
// empty.
func (s *PromServer) Query(expr string) (v float64, ok bool, err error) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(s.URL + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, false, fmt.Errorf("query %q: %w", expr, err)
	}
	if r.Status != "success" {
		return 0, false, fmt.Errorf("query %q: %s", expr, r.Error)
	}
	switch len(r.Data.Result) {
	case 0:
		return 0, false, nil
	case 1:
	default:
		return 0, false, fmt.Errorf("query %q returned %d series, want one", expr, len(r.Data.Result))
	}
	str, _ := r.Data.Result[0].Value[1].(string)
	v, err = strconv.ParseFloat(str, 64)
	return v, err == nil, err
}

// ScrapeMetrics fetches url (a /metrics endpoint) as Prometheus does and
// parses it with Prometheus's own text parser; a parse error is an error.
func ScrapeMetrics(url string) (map[string]*dto.MetricFamily, error) {
	client := http.Client{Timeout: 5 * time.Second}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: Prometheus's parser rejects the text: %w", url, err)
	}
	return fams, nil
}

// MetricSum adds up every sample of a counter or gauge family whose labels
// include match; ok is false when no sample matches.
func MetricSum(fams map[string]*dto.MetricFamily, name string, match map[string]string) (sum float64, ok bool) {
	for _, m := range fams[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		matches := true
		for k, v := range match {
			if labels[k] != v {
				matches = false
			}
		}
		if !matches {
			continue
		}
		ok = true
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
	}
	return sum, ok
}
