package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// JaegerBinEnv names an already-built Jaeger (tests/run sets it).
const JaegerBinEnv = "RELIABLE_MQTT_JAEGER_BIN"

// JaegerVersion is the Jaeger that tests/tools/jaeger/go.mod pins.
const JaegerVersion = "v1.76.0"

// jaegerBuildTimeout bounds a cold build of Jaeger (an OpenTelemetry
// collector with every storage backend) on a loaded two-core machine.
const jaegerBuildTimeout = 45 * time.Minute

// jaegerStartTimeout bounds how long Jaeger may take to answer its query API.
const jaegerStartTimeout = 60 * time.Second

// Jaeger is a real Jaeger (v2, an OpenTelemetry collector) with in-memory
// storage on free loopback ports, SIGKILLed at cleanup.
type Jaeger struct {
	OTLPHTTP string // host:port of the OTLP/HTTP receiver
	OTLPGRPC string // host:port of the OTLP/gRPC receiver
	QueryURL string // http://host:port of the query API (and UI)
}

// JaegerBinary returns the path of the Jaeger executable: $RELIABLE_MQTT_JAEGER_BIN,
// else the copy cached under the user cache directory, built there once
// from tests/tools/jaeger (its own module, so the main go.mod does not take
// Jaeger's dependencies). Concurrent test binaries wait for one build.
func JaegerBinary(t testing.TB) string {
	t.Helper()
	if p, ok := fromEnv(t, JaegerBinEnv); ok {
		return p
	}
	p, err := JaegerCachePath()
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	if err := buildJaeger(ModuleRoot(t), p); err != nil {
		t.Fatalf("harness: %v", err)
	}
	return p
}

// JaegerCachePath is where the built Jaeger is kept between runs.
func JaegerCachePath() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the Jaeger build: %w (set %s)", err, JaegerBinEnv)
	}
	return filepath.Join(dir, "reliable-mqtt", "jaeger-"+JaegerVersion, "jaeger"), nil
}

// buildJaeger builds Jaeger to path unless it is there, under an exclusive
// lock beside it; the binary appears by rename, complete or not at all.
func buildJaeger(root, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), jaegerBuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", path+".tmp", "github.com/jaegertracing/jaeger/cmd/jaeger")
	cmd.Dir = filepath.Join(root, "tests", "tools", "jaeger")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building Jaeger %s in %s: %v\n%s", JaegerVersion, cmd.Dir, err, out)
	}
	return os.Rename(path+".tmp", path)
}

// StartJaeger runs Jaeger with in-memory storage: OTLP receivers and the
// query API on free loopback ports, nothing else listening.
func StartJaeger(t testing.TB) *Jaeger {
	t.Helper()
	exe := JaegerBinary(t)
	dir := t.TempDir()
	addr := func() string { return "127.0.0.1:" + strconv.Itoa(FreePort(t)) }
	j := &Jaeger{OTLPHTTP: addr(), OTLPGRPC: addr()}
	queryHTTP, queryGRPC, health := addr(), addr(), addr()
	j.QueryURL = "http://" + queryHTTP
	conf := filepath.Join(dir, "jaeger.yaml")
	yml := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: %q
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: %q
    grpc:
      endpoint: %q
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %q
      http:
        endpoint: %q
processors:
  batch:
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`, health, queryHTTP, queryGRPC, j.OTLPGRPC, j.OTLPHTTP)
	if err := os.WriteFile(conf, []byte(yml), 0o644); err != nil {
		t.Fatalf("harness: write %s: %v", conf, err)
	}
	logPath := filepath.Join(dir, "jaeger.log")
	c, err := startChild(exe, []string{"--config", conf}, os.Environ(), dir, logPath, "=== harness: jaeger ===")
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("jaeger, last log lines:\n%s", tail(logPath, 40))
		}
		if err := c.kill(); err != nil {
			t.Errorf("harness: stop jaeger: %v", err)
		}
	})
	ok := Poll(jaegerStartTimeout, func() bool {
		var services struct{ Data []string }
		return c.running() && j.get("/api/services", nil, &services) == nil
	})
	if !ok {
		t.Fatalf("harness: jaeger did not answer %s/api/services within %s; log:\n%s", j.QueryURL, jaegerStartTimeout, tail(logPath, 40))
	}
	return j
}

// JaegerTrace is one trace as Jaeger's query API returns it.
type JaegerTrace struct {
	TraceID   string                   `json:"traceID"`
	Spans     []JaegerSpan             `json:"spans"`
	Processes map[string]JaegerProcess `json:"processes"`
}

// JaegerSpan is one span of a JaegerTrace.
type JaegerSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime int64 `json:"startTime"` // µs since the epoch
	Duration  int64 `json:"duration"`  // µs
	Tags      []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
	ProcessID string `json:"processID"`
}

// JaegerProcess names the service of spans.
type JaegerProcess struct {
	ServiceName string `json:"serviceName"`
}

// Tag returns the span's tag key as a string ("" when absent).
func (s JaegerSpan) Tag(key string) string {
	for _, t := range s.Tags {
		if t.Key == key {
			return fmt.Sprint(t.Value)
		}
	}
	return ""
}

// Parent is the span ID this span is a child of ("" for a root).
func (s JaegerSpan) Parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// Traces returns up to limit traces that have spans of service, from the
// last hour.
func (j *Jaeger) Traces(service string, limit int) ([]JaegerTrace, error) {
	q := url.Values{"service": {service}, "limit": {strconv.Itoa(limit)}, "lookback": {"1h"}}
	var out struct {
		Data []JaegerTrace `json:"data"`
	}
	err := j.get("/api/traces", q, &out)
	return out.Data, err
}

func (j *Jaeger) get(path string, q url.Values, into any) error {
	u := j.QueryURL + path
	if q != nil {
		u += "?" + q.Encode()
	}
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}
