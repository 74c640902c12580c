package bench

import (
	"fmt"
	"testing"

	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/otelcollector"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// BenchmarkTracing measures what the open_telemetry_collector tracer
// costs the output: EndToEnd over MQTT 5 (the set-up of BenchmarkProtocol's
// "EndToEnd/protocol=5" row: outbox on, window 64, 64 writers, 100-byte
// messages, the bench's ACKer) with no tracer, then sampling 1 % and 100 %
// of traces exported over OTLP/HTTP to a real Jaeger (in-memory storage),
// then no tracer again, so the first and last rows show the run's spread.
// With a tracer every record gets a span from its write to its ACK and a
// traceparent user property stored with it.
//
//	go test -run '^$' -bench '^BenchmarkTracing$' -benchtime=20000x ./tests/bench/
func BenchmarkTracing(b *testing.B) {
	jaeger := harness.StartJaeger(b)
	for _, c := range []struct {
		name  string
		ratio float64 // 0: no tracer
	}{
		{"tracer=none", 0},
		{"sampling=1%", 0.01},
		{"sampling=100%", 1},
		{"tracer=none,again", 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			tracer := ""
			if c.ratio > 0 {
				tracer = fmt.Sprintf(`open_telemetry_collector:
  service: bench
  http: [ { address: %q } ]
  sampling: { enabled: true, ratio: %v }
`, jaeger.OTLPHTTP, c.ratio)
			}
			m := broker(b)
			startAcker(b, m.URL(), "bench/tracing/data", "bench/tracing/acks")
			s := startTracedStream(b, m.URL(), tracer, "topic: bench/tracing", `protocol_version: "5"`,
				"confirm: end_to_end", "data_topic: bench/tracing/data", "ack_topic: bench/tracing/acks")
			measureLive(b, m, s, "ACKed")
		})
	}
}
