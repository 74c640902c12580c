package bench

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// BeforeBinaryEnv names a reliable-mqtt binary built from an earlier
// commit; BenchmarkPublisherProcess then measures it beside this build, in
// interleaved rounds of one run (as tests/e2e's CPU measurement does).
const BeforeBinaryEnv = "RELIABLE_MQTT_BEFORE_BIN"

// publisherConfig: a publisher process, generated 100-byte JSON readings
// (%[2]d of them) into reliable_mqtt_out with confirm: broker and its
// defaults (64 writes in flight, as BrokerConfirm).
const publisherConfig = `
http:
  address: 127.0.0.1:%[1]d
metrics:
  prometheus: {}
input:
  generate:
    interval: ""
    mapping: |
      root = if counter() > %[2]d { deleted() } else { {"reading": "%[3]s"} }
output:
  reliable_mqtt_out:
    urls: [ "%[4]s" ]
    topic: bench/process
    outbox:
      path: ./outbox.db
`

// BenchmarkPublisherProcess: reliable_mqtt_out with confirm: broker and
// its defaults in a real process against mosquitto on loopback: msgs/s
// from the first confirmation to the last and the p50/p99 of its
// publish-to-PUBACK summary. With RELIABLE_MQTT_BEFORE_BIN it runs
// BENCH_ROUNDS rounds (default 3), each the before binary and this one
// (the order alternating), each on a fresh mosquitto, and reports the
// medians of both and the ratios this/before (the loopback check that a
// change costs no latency):
//
//	git worktree add /tmp/before <commit> && (cd /tmp/before && go build -o /tmp/rm-before ./cmd/reliable-mqtt)
//	RELIABLE_MQTT_BEFORE_BIN=/tmp/rm-before BENCH_ROUNDS=5 go test -run '^$' -bench '^BenchmarkPublisherProcess$' -benchtime=30000x -timeout 60m ./tests/bench/
func BenchmarkPublisherProcess(b *testing.B) {
	builds := []struct{ name, bin string }{{"this", harness.Binary(b)}}
	rounds := 1
	// go test's first call (b.N = 1) only sizes the run: one build, once.
	if bin := os.Getenv(BeforeBinaryEnv); bin != "" && b.N > 1 {
		builds = append([]struct{ name, bin string }{{"before", bin}}, builds...)
		rounds = 3
		if n, err := strconv.Atoi(os.Getenv("BENCH_ROUNDS")); err == nil && n > 0 {
			rounds = n
		}
	}
	samples := map[string][]processSample{}
	for round := range rounds {
		for i := range builds {
			bd := builds[(i+round)%len(builds)]
			m := broker(b)
			port := harness.FreePort(b)
			p := harness.RunPipeline(b, fmt.Sprintf(publisherConfig, port, b.N, strings.Repeat("x", 80), m.URL()), harness.ProcOptions{Binary: bd.bin})
			s := scrapeUntilConfirmed(b, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), b.N, nil)
			if err := p.Stop(15 * time.Second); err != nil {
				b.Error(err)
			}
			m.Kill()
			// To stderr: go test keeps only the first lines a benchmark logs.
			fmt.Fprintf(os.Stderr, "PublisherProcess round %d, %s: %.0f msgs/s, p50 %.2f ms, p99 %.2f ms\n", round+1, bd.name, s.rate, s.p50, s.p99)
			samples[bd.name] = append(samples[bd.name], s)
		}
	}
	b.ReportMetric(0, "ns/op")
	this := medianSample(samples["this"])
	b.ReportMetric(this.rate, "msgs/s")
	b.ReportMetric(this.p50, "p50_ms")
	b.ReportMetric(this.p99, "p99_ms")
	if before, ok := samples["before"]; ok {
		bf := medianSample(before)
		b.ReportMetric(bf.rate, "before_msgs/s")
		b.ReportMetric(bf.p50, "before_p50_ms")
		b.ReportMetric(bf.p99, "before_p99_ms")
		// The median of the per-round ratios: each round's pair ran
		// back to back, at about the same load.
		b.ReportMetric(medianRatio(samples["this"], before, func(s processSample) float64 { return s.rate }), "rate_ratio")
		b.ReportMetric(medianRatio(samples["this"], before, func(s processSample) float64 { return s.p50 }), "p50_ratio")
		b.ReportMetric(medianRatio(samples["this"], before, func(s processSample) float64 { return s.p99 }), "p99_ratio")
	}
}

// processSample is one run's confirmed rate and latency quantiles (ms).
type processSample struct{ rate, p50, p99 float64 }

// scrapeUntilConfirmed polls a process's metrics until n records are
// confirmed and returns the rate from the first confirmation to the last
// and the confirm latency summary's p50/p99. onFirst, if not nil, runs at
// the first confirmation.
func scrapeUntilConfirmed(b *testing.B, metricsURL string, n int, onFirst func()) processSample {
	b.Helper()
	var (
		s      processSample
		c0     float64
		t0, t1 time.Time
	)
	ok := harness.Poll(10*time.Minute, func() bool {
		f, err := harness.ScrapeMetrics(metricsURL)
		if err != nil {
			return false
		}
		v, _ := harness.MetricSum(f, "reliable_mqtt_out_confirmed", nil)
		now := time.Now()
		if v > 0 && t0.IsZero() {
			c0, t0 = v, now
			if onFirst != nil {
				onFirst()
			}
		}
		if v >= float64(n) {
			t1 = now
			s.p50 = quantileMs(f, "reliable_mqtt_out_confirm_latency_ns", 0.5)
			s.p99 = quantileMs(f, "reliable_mqtt_out_confirm_latency_ns", 0.99)
			return true
		}
		time.Sleep(80 * time.Millisecond)
		return false
	})
	if !ok {
		b.Fatalf("the publisher did not confirm %d messages within 10 minutes", n)
	}
	if t1.After(t0) {
		s.rate = (float64(n) - c0) / t1.Sub(t0).Seconds()
	}
	return s
}

func medianSample(ss []processSample) processSample {
	pick := func(f func(processSample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		return median(v)
	}
	return processSample{
		rate: pick(func(s processSample) float64 { return s.rate }),
		p50:  pick(func(s processSample) float64 { return s.p50 }),
		p99:  pick(func(s processSample) float64 { return s.p99 }),
	}
}

func medianRatio(this, before []processSample, f func(processSample) float64) float64 {
	var v []float64
	for i := range min(len(this), len(before)) {
		if d := f(before[i]); d > 0 {
			v = append(v, f(this[i])/d)
		}
	}
	return median(v)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
