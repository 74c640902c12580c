package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// chainPublisherConfig: a publisher process, generated 100-byte JSON
// readings (%[2]d of them, at most %[3]d per 10 ms) into reliable_mqtt_out
// with end-to-end confirmation and the default window on broker A.
const chainPublisherConfig = `
http:
  address: 127.0.0.1:%[1]d
  debug_endpoints: true
metrics:
  prometheus: {}
rate_limit_resources:
  - label: offered
    local: { count: %[3]d, interval: 10ms }
input:
  generate:
    interval: ""
    mapping: |
      root = if counter() > %[2]d { deleted() } else { {"reading": "%[4]s"} }
pipeline:
  processors:
    - rate_limit: { resource: offered }
output:
  reliable_mqtt_out:
    urls: [ "%[5]s" ]
    topic: bench/readings
    confirm: end_to_end
    data_topic: bench/ingress
    ack_topic: bench/acks
    max_in_flight: 64
    outbox:
      path: ./outbox.db
`

// chainBridgeConfig: a bridge process, reliable_mqtt_in on broker A (ACKs
// each envelope once the pipeline is done with it) into reliable_mqtt_out
// on broker B in direct mode: a message is done, and ACKed, after broker
// B's PUBACK.
const chainBridgeConfig = `
http:
  address: 127.0.0.1:%[1]d
  debug_endpoints: true
metrics:
  prometheus: {}
input:
  reliable_mqtt_in:
    urls: [ "%[2]s" ]
    client_id: bench-bridge
    topics: [ bench/ingress ]
    qos: 1
    envelope: ingress
    ack_topic: bench/acks
output:
  reliable_mqtt_out:
    urls: [ "%[3]s" ]
    client_id: bench-bridge-out
    topic: ${! meta("destination_topic") }
    event_id: ${! meta("event_id") }
    max_in_flight: %[4]d
    outbox:
      enabled: false
`

// BenchmarkChain measures end-to-end confirmation through real processes:
// publisher → mosquitto A → bridge → mosquitto B, the ACK back through A.
// "full" generates as fast as it can; "half" generates at half the rate
// "full" reached (CHAIN_HALF_RATE=<msgs/s> sets it when run alone).
// msgs/s is the publisher's reliable_mqtt_out_confirmed counter, from the
// first confirmation to the last; p50/p99 are its confirm latency summary
// (publish → ACK). BENCH_CPUPROFILE=<file> saves 5 s CPU profiles of both
// processes during "full" to <file>.chain-publisher and <file>.chain-bridge
// (use a b.N that lasts longer).
func BenchmarkChain(b *testing.B) {
	var full float64
	b.Run("full", func(b *testing.B) { full = benchChain(b, 0) })
	if v, err := strconv.ParseFloat(os.Getenv("CHAIN_HALF_RATE"), 64); err == nil && v > 0 {
		full = 2 * v
	}
	if full > 0 {
		b.Run("half", func(b *testing.B) { benchChain(b, full/2) })
	}
}

func benchChain(b *testing.B, rate float64) float64 {
	a := broker(b)
	dest := broker(b)
	perTick := 1 << 30 // unlimited
	if rate > 0 {
		perTick = max(1, int(rate/100))
	}
	bridgePort, port := harness.FreePort(b), harness.FreePort(b)
	harness.RunPipeline(b, fmt.Sprintf(chainBridgeConfig, bridgePort, a.URL(), dest.URL(), bridgeInFlight()), harness.ProcOptions{})
	harness.RunPipeline(b, fmt.Sprintf(chainPublisherConfig, port, b.N, perTick, strings.Repeat("x", 80), a.URL()), harness.ProcOptions{})
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)

	var (
		profiling bool
		profDone  = make(chan error, 2)
	)
	onFirst := func() {
		if path := os.Getenv("BENCH_CPUPROFILE"); path != "" && rate == 0 {
			// Both processes, 5 s each, during the full-rate run.
			profiling = true
			for name, p := range map[string]int{"publisher": port, "bridge": bridgePort} {
				go func() {
					profDone <- saveProfile(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=5", p), path+".chain-"+name)
				}()
			}
		}
	}
	s := scrapeUntilConfirmed(b, metricsURL, b.N, onFirst)
	if profiling {
		for range 2 {
			if err := <-profDone; err != nil {
				b.Errorf("cpu profile: %v", err)
			}
		}
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(s.rate, "msgs/s")
	b.ReportMetric(s.p50, "p50_ms")
	b.ReportMetric(s.p99, "p99_ms")
	if rate > 0 {
		b.ReportMetric(float64(100*perTick), "offered_msgs/s")
	}
	return s.rate
}

// quantileMs reads quantile q of a summary in nanoseconds, as milliseconds
// (-1 when absent).
func quantileMs(fams map[string]*dto.MetricFamily, name string, q float64) float64 {
	for _, m := range fams[name].GetMetric() {
		for _, qq := range m.GetSummary().GetQuantile() {
			if qq.GetQuantile() == q {
				return qq.GetValue() / 1e6
			}
		}
	}
	return -1
}

// bridgeInFlight is the bridge output's max_in_flight: 64, or
// CHAIN_BRIDGE_IN_FLIGHT.
func bridgeInFlight() int {
	if v, err := strconv.Atoi(os.Getenv("CHAIN_BRIDGE_IN_FLIGHT")); err == nil && v > 0 {
		return v
	}
	return 64
}
