package bench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// backlogFillConfig: a publisher whose broker is unreachable stores %[2]d
// 100-byte readings (a source batching by 64) in its outbox, then idles.
const backlogFillConfig = `
http:
  address: 127.0.0.1:%[1]d
metrics:
  prometheus: {}
input:
  generate:
    interval: ""
    batch_size: 64
    mapping: |
      root = if counter() > %[2]d { deleted() } else { "%[3]s" }
output:
  reliable_mqtt_out:
    urls: [ "tcp://127.0.0.1:%[4]d" ]
    client_id: bench-backlog
    topic: bench/backlog
    outbox:
      path: %[5]s
`

// backlogDrainConfig: the same publisher restarted with the broker back
// and nothing new to send: it drains the backlog.
const backlogDrainConfig = `
http:
  address: 127.0.0.1:%[1]d
  debug_endpoints: true
metrics:
  prometheus: {}
input:
  generate:
    interval: 1h
    mapping: root = deleted()
output:
  reliable_mqtt_out:
    urls: [ "%[2]s" ]
    client_id: bench-backlog
    topic: bench/backlog
    outbox:
      path: %[3]s
`

// BenchmarkBacklogMemory measures the memory of the real process draining
// a b.N-record backlog (run it with -benchtime=1000000x): the fill runs
// with the broker unreachable, then the process restarts with mosquitto
// up and sends everything. /proc/<pid>/status is sampled every ~50 ms
// during the drain: max_anon_MiB is the largest RssAnon (Go heap, stacks,
// runtime), max_file_MiB the largest RssFile (bbolt's read-only mmap of
// the outbox file, page cache the kernel can drop and reread), hwm_MiB
// VmHWM (peak RSS, both together); fill_max_anon_MiB is the largest
// RssAnon of the filling process. With BENCH_HEAPPROFILE=<file> it saves
// the heap profile taken halfway through the drain.
func BenchmarkBacklogMemory(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "outbox.db")
	fillPort := harness.FreePort(b)
	fill := harness.RunPipeline(b, fmt.Sprintf(backlogFillConfig, fillPort, b.N, strings.Repeat("x", 100), harness.FreePort(b), path), harness.ProcOptions{})
	var fillAnon int64
	filled := waitCounter(fmt.Sprintf("http://127.0.0.1:%d/metrics", fillPort), "output_sent", b.N, 20*time.Minute, func() {
		if anon, _, _, err := procMemKiB(fill.Pid()); err == nil {
			fillAnon = max(fillAnon, anon)
		}
	})
	if !filled {
		b.Fatalf("the fill did not store %d records", b.N)
	}
	if err := fill.Stop(30 * time.Second); err != nil {
		b.Fatalf("stopping the fill: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}

	m := broker(b)
	port := harness.FreePort(b)
	b.ResetTimer()
	drain := harness.RunPipeline(b, fmt.Sprintf(backlogDrainConfig, port, m.URL(), path), harness.ProcOptions{})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	var maxAnon, maxFile, hwm int64
	var t0, t1 time.Time
	heapTaken := false
	ok := harness.Poll(20*time.Minute, func() bool {
		pid := drain.Pid()
		if anon, file, peak, err := procMemKiB(pid); err == nil {
			maxAnon, maxFile, hwm = max(maxAnon, anon), max(maxFile, file), max(hwm, peak)
		}
		fams, err := harness.ScrapeMetrics(base + "/metrics")
		if err != nil {
			return false
		}
		v, _ := harness.MetricSum(fams, "reliable_mqtt_out_confirmed", nil)
		if v > 0 && t0.IsZero() {
			t0 = time.Now()
		}
		if p := os.Getenv("BENCH_HEAPPROFILE"); p != "" && !heapTaken && v >= float64(b.N/2) {
			heapTaken = true
			if err := saveProfile(base+"/debug/pprof/heap", p); err != nil {
				b.Errorf("heap profile: %v", err)
			}
		}
		if v >= float64(b.N) {
			t1 = time.Now()
			return true
		}
		time.Sleep(30 * time.Millisecond)
		return false
	})
	if !ok {
		b.Fatalf("the backlog of %d records did not drain", b.N)
	}
	b.ReportMetric(0, "ns/op")
	if t1.After(t0) {
		b.ReportMetric(float64(b.N)/t1.Sub(t0).Seconds(), "msgs/s")
	}
	b.ReportMetric(float64(fillAnon)/1024, "fill_max_anon_MiB")
	b.ReportMetric(float64(maxAnon)/1024, "max_anon_MiB")
	b.ReportMetric(float64(maxFile)/1024, "max_file_MiB")
	b.ReportMetric(float64(hwm)/1024, "hwm_MiB")
	b.ReportMetric(float64(st.Size())/(1<<20), "outbox_MiB")
}

// waitCounter waits until the summed counter name at url reaches n,
// calling sample between scrapes.
func waitCounter(url, name string, n int, timeout time.Duration, sample func()) bool {
	return harness.Poll(timeout, func() bool {
		sample()
		fams, err := harness.ScrapeMetrics(url)
		if err != nil {
			return false
		}
		v, _ := harness.MetricSum(fams, name, nil)
		if v >= float64(n) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
		return false
	})
}

// procMemKiB reads RssAnon, RssFile and VmHWM of pid.
func procMemKiB(pid int) (anon, file, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "RssAnon":
			anon = n
		case "RssFile":
			file = n
		case "VmHWM":
			hwm = n
		}
	}
	return anon, file, hwm, sc.Err()
}
