package bench

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// binaryAppendsConfig is what a user writes to buffer readings on disk while
// the broker is away: a generator (100-byte payloads, as fast as it can, in
// batches of %[6]d), reliable_mqtt_out with 64 writes in flight, generated
// event IDs, and the output's batching policy if %[5]s sets one. The broker URL
// points at a closed port, so every write is a durable append and nothing
// is sent. The generator stops after %[2]d messages but the process stays
// up.
const binaryAppendsConfig = `
http:
  address: 127.0.0.1:%[1]d
  debug_endpoints: true
metrics:
  prometheus: {}
input:
  generate:
    interval: ""
    batch_size: %[6]d
    mapping: |
      root = if counter() > %[2]d { deleted() } else { "%[3]s" }
output:
  reliable_mqtt_out:
    urls: [ "tcp://127.0.0.1:%[4]d" ]
    client_id: bench-appends
    topic: bench/appends
    max_in_flight: 64
%[5]s    outbox:
      path: ./outbox.db
`

// BenchmarkBinaryAppends measures durable appends through the real binary:
// binaryAppendsConfig run by reliable-mqtt, b.N messages: without batching,
// with the output's batching policy grouping single messages by 64, and
// with a source that produces batches of 64. msgs/s is taken
// from Benthos's own output_sent counter (a write counts once the outbox
// fsync'd it), scraped about every 100 ms (a scrape costs the process CPU), from the first scrape that shows a
// write to the one that shows all b.N, so process start-up is left out.
//
// With BENCH_CPUPROFILE=<file> it also saves a 10 s CPU profile of each
// process (to <file>.batching=…) taken from Benthos's /debug/pprof/profile during the fill (use
// a b.N that takes longer than 10 s).
func BenchmarkBinaryAppends(b *testing.B) {
	for _, c := range []struct {
		name      string
		policy    string // the output's batching line, if any
		inputSize int    // generate's batch_size
	}{
		{"batching=none", "", 1},
		{"batching=output64", "    batching: { count: 64, period: 10ms }\n", 1},
		{"batching=input64", "", 64},
	} {
		b.Run(c.name, func(b *testing.B) { benchBinaryAppends(b, c.policy, c.inputSize) })
	}
}

func benchBinaryAppends(b *testing.B, policy string, inputSize int) {
	port := harness.FreePort(b)
	closed := harness.FreePort(b) // nothing listens: the broker is unreachable
	payload := strings.Repeat("x", 100)
	p := harness.RunPipeline(b, fmt.Sprintf(binaryAppendsConfig, port, b.N, payload, closed, policy, inputSize), harness.ProcOptions{})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)

	profDone := make(chan error, 1)
	profiling := false
	sent := func() float64 {
		fams, err := harness.ScrapeMetrics(base + "/metrics")
		if err != nil {
			return -1
		}
		v, _ := harness.MetricSum(fams, "output_sent", nil)
		return v
	}
	var (
		c0     float64
		t0, t1 time.Time
	)
	ok := harness.Poll(10*time.Minute, func() bool {
		if !p.Running() {
			return true
		}
		v := sent()
		now := time.Now()
		if v > 0 && t0.IsZero() {
			c0, t0 = v, now
			if path := os.Getenv("BENCH_CPUPROFILE"); path != "" && !profiling {
				profiling = true
				path += "." + b.Name()[strings.LastIndex(b.Name(), "/")+1:] // one file per sub-benchmark
				go func() { profDone <- saveProfile(base+"/debug/pprof/profile?seconds=10", path) }()
			}
		}
		if v >= float64(b.N) {
			t1 = now
			return true
		}
		time.Sleep(80 * time.Millisecond) // with Poll's 20 ms: a scrape per ~100 ms
		return false
	})
	if !ok || t1.IsZero() {
		b.Fatalf("output_sent did not reach %d within 10 minutes (running: %v)", b.N, p.Running())
	}
	if profiling {
		if err := <-profDone; err != nil {
			b.Errorf("cpu profile: %v", err)
		}
	}
	b.ReportMetric(0, "ns/op")
	if t1.After(t0) {
		b.ReportMetric((float64(b.N)-c0)/t1.Sub(t0).Seconds(), "msgs/s")
	}
}

func saveProfile(url, path string) error {
	client := http.Client{Timeout: time.Minute}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
