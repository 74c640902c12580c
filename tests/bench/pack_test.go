package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// reading is the i-th of a gateway's JSON readings, about 140 bytes.
func reading(i int) []byte {
	return fmt.Appendf(nil, `{"machine":"press-1","run_id":"20261203T230000.000Z","seq":%d,"site":"plant-a","temperature":%d.%d,"humidity":%d,"state":"running"}`,
		i, 15+i%15, i%10, 30+i%40)
}

// BenchmarkPack compares, in one run against mosquitto on loopback over
// MQTT 3.1.1, the same ~140-byte readings published three ways: plain paho
// QoS 1 with 65,535 in flight (done at the PUBACK); reliable_mqtt_out with
// confirm: end_to_end unpacked; and the same packed (pack.max_events 64).
// The pipelines are fed as wanForm's batching form: the output's batching
// on and everything else default (max_in_flight 64), with a source that
// keeps many readings in flight, as an input does; 64 writers that each
// wait for their one reading would hold one batch, one fsync, at a time.
// The end-to-end consumer is the bench's own ACKer, which reads frames and
// envelopes and ACKs each at once. A byte-counting proxy on the publisher's
// link gives link bytes per reading (up: publisher to broker; down: back),
// and the broker's CPU time per reading is read from /proc.
//
//	go test -run '^$' -bench '^BenchmarkPack$' -benchtime 200000x ./tests/bench/
func BenchmarkPack(b *testing.B) {
	b.Run("paho_qos1", func(b *testing.B) {
		m := broker(b)
		proxy := harness.NewProxy(b, m.Addr())
		lm := startLinkMeter(m, proxy)
		pahoPublishEach(b, m, proxy.URL(), "bench/pack/dest", 65535, reading)
		lm.report(b)
	})
	for _, packed := range []bool{false, true} {
		name := map[bool]string{false: "unpacked", true: "packed"}[packed]
		b.Run(name, func(b *testing.B) {
			m := broker(b)
			proxy := harness.NewProxy(b, m.Addr())
			startAcker(b, m.URL(), "bench/pack/data", "bench/pack/acks")
			s := wanForm{batching: true}.start(b, proxy.URL(), packFields(packed)...)
			s.payload = reading
			lm := startLinkMeter(m, proxy)
			measureLive(b, m, s, "ACKed")
			lm.report(b)
		})
	}
}

// packFields are the output fields of an end-to-end publisher to the
// bench's ACKer, packed or not, and extra.
func packFields(packed bool, extra ...string) []string {
	f := append([]string{"topic: bench/pack/dest", "confirm: end_to_end", "data_topic: bench/pack/data", "ack_topic: bench/pack/acks"}, extra...)
	if packed {
		f = append(f, "pack: { max_events: 64 }")
	}
	return f
}

// linkMeter counts a publisher's link bytes (through proxy) and the
// broker's CPU time from its start to report.
type linkMeter struct {
	proxy      *harness.Proxy
	up0, down0 int64
	brokerPid  int
	broker0    time.Duration
}

func startLinkMeter(m *harness.Mosquitto, proxy *harness.Proxy) *linkMeter {
	up, down := proxy.Bytes()
	return &linkMeter{proxy: proxy, up0: up, down0: down, brokerPid: m.Pid(), broker0: procCPU(m.Pid())}
}

// report adds link_up_B/reading, link_down_B/reading and broker_us/reading.
func (l *linkMeter) report(b *testing.B) {
	up, down := l.proxy.Bytes()
	n := float64(b.N)
	b.ReportMetric(float64(up-l.up0)/n, "link_up_B/reading")
	b.ReportMetric(float64(down-l.down0)/n, "link_down_B/reading")
	b.ReportMetric(float64((procCPU(l.brokerPid)-l.broker0).Microseconds())/n, "broker_us/reading")
}

// BenchmarkPackWAN: end to end on MQTT 5 against a mosquitto with its
// default Receive Maximum of 20, packed (pack.max_events 64) and unpacked,
// at each round trip of WAN_RTTS (default 0s and 100ms), with the output's
// batching on (wanForm). One frame holds one of the 20 slots, so packing
// lifts the bound the Receive Maximum sets from 20 to 20 × 64 events per
// round trip. A benchtime in seconds sizes every case to about that long,
// so the connection and the first round trips weigh little:
//
//	go test -run '^$' -bench '^BenchmarkPackWAN$' -benchtime 10s -timeout 30m ./tests/bench/
func BenchmarkPackWAN(b *testing.B) {
	if os.Getenv("WAN_RTTS") == "" {
		b.Setenv("WAN_RTTS", "0s,100ms")
	}
	for _, rtt := range wanRTTs(b) {
		for _, packed := range []bool{false, true} {
			name := fmt.Sprintf("rtt=%s/e2e/5/rm20/%s", rtt, map[bool]string{false: "unpacked", true: "packed"}[packed])
			b.Run(name, func(b *testing.B) {
				m := harness.StartMosquitto(b, harness.MosquittoOptions{}) // max_inflight_messages 20
				startAcker(b, m.URL(), "bench/pack/data", "bench/pack/acks")
				s := wanForm{batching: true}.start(b, wanLink(b, m, rtt).URL(), packFields(packed, "protocol_version: 5")...)
				measureLive(b, m, s, "ACKed")
			})
		}
	}
}

// BenchmarkPackLatency: confirmation latency at 100 readings/s (one
// writer, one reading every 10 ms), end to end on loopback, unpacked and
// packed: a reading waiting alone goes at once, so packing adds none.
//
//	go test -run '^$' -bench BenchmarkPackLatency -benchtime 1000x ./tests/bench/
func BenchmarkPackLatency(b *testing.B) {
	for _, packed := range []bool{false, true} {
		b.Run(map[bool]string{false: "unpacked", true: "packed"}[packed], func(b *testing.B) {
			m := broker(b)
			startAcker(b, m.URL(), "bench/pack/data", "bench/pack/acks")
			s := startStream(b, m.URL(), packFields(packed)...)
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				<-tick.C
				ctx, cancel := context.WithTimeout(context.Background(), waitAll)
				err := s.send(ctx, service.NewMessage(reading(i)))
				cancel()
				if err != nil {
					b.Fatal(err)
				}
			}
			if !s.capture.waitConfirmed(int64(b.N), waitAll) {
				b.Fatalf("only %d of %d ACKed within %s", s.capture.confirmed.Load(), b.N, waitAll)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			p50, p99 := s.capture.percentiles()
			reportRate(b, b.N, elapsed, p50, p99)
		})
	}
}
