package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttin"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// The WAN benchmarks put a Toxiproxy link (tests/harness.Link) between the
// publisher and mosquitto: half the round trip each way, and optionally a
// bandwidth cap. Every figure of one RTT is measured through the same
// link settings in the same run, beside a plain paho QoS 1 publisher with
// 65,535 publishes in flight (the protocol's most). reliable_mqtt_out runs
// with its default flow control (no `window` set). ACKers and subscribers
// sit at the broker, on loopback: the link is the publisher's hop.

// wanTopic is the publish topic; its length is part of the framing below.
const wanTopic = "bench/wan"

// publishBytes is the size on the wire of one QoS 1 PUBLISH of payload100
// to wanTopic (3.1.1): 1 type byte, 1 remaining-length byte, 2 + len(topic),
// a 2-byte packet ID and the payload.
const publishBytes = 1 + 1 + 2 + len(wanTopic) + 2 + 100

// wanRTTs are the round trips measured: WAN_RTTS="100ms,300ms" selects.
func wanRTTs(b *testing.B) []time.Duration {
	spec := os.Getenv("WAN_RTTS")
	if spec == "" {
		spec = "0s,20ms,100ms,300ms"
	}
	var out []time.Duration
	for _, s := range strings.Split(spec, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			b.Fatalf("WAN_RTTS: %v", err)
		}
		out = append(out, d)
	}
	return out
}

// wanLink is a link to m with round trip rtt (no toxic at 0).
func wanLink(b *testing.B, m *harness.Mosquitto, rtt time.Duration) *harness.Link {
	l := harness.NewLink(b, m.Addr())
	if rtt > 0 {
		l.Latency(rtt/2, 0)
	}
	return l
}

// BenchmarkWAN: confirmed msgs/s at each RTT of WAN_RTTS, for confirm:
// broker and end_to_end on MQTT 3.1.1 and 5, against the paho baseline;
// `e2e/5/rm20` is end to end on MQTT 5 against a mosquitto with its
// default max_inflight_messages 20 (the Receive Maximum it announces), and
// `broker/3.1.1/max_inflight=20` a 3.1.1 publisher against that mosquitto
// (which does not hold 3.1.1 publishers to it). Each case runs in the
// forms of WAN_BATCHING ("unbatched,batching" by default; see wanForms).
func BenchmarkWAN(b *testing.B) {
	for _, rtt := range wanRTTs(b) {
		b.Run(fmt.Sprintf("rtt=%s", rtt), func(b *testing.B) {
			b.Run("paho", func(b *testing.B) {
				m := broker(b)
				pahoPublish(b, m, wanLink(b, m, rtt).URL(), wanTopic, 65535)
			})
			for _, form := range wanForms(b) {
				for _, proto := range wanProtocols() {
					b.Run(form.name("broker/"+proto), func(b *testing.B) {
						m := broker(b)
						s := form.start(b, wanLink(b, m, rtt).URL(), "topic: "+wanTopic, "protocol_version: "+proto)
						measureLive(b, m, s, "confirmed")
					})
					b.Run(form.name("e2e/"+proto), func(b *testing.B) {
						m := broker(b)
						wanEndToEnd(b, m, rtt, proto, form)
					})
				}
				b.Run(form.name("broker/3.1.1/max_inflight=20"), func(b *testing.B) {
					m := harness.StartMosquitto(b, harness.MosquittoOptions{}) // max_inflight_messages 20
					s := form.start(b, wanLink(b, m, rtt).URL(), "topic: "+wanTopic)
					measureLive(b, m, s, "confirmed")
				})
				b.Run(form.name("e2e/5/rm20"), func(b *testing.B) {
					m := harness.StartMosquitto(b, harness.MosquittoOptions{}) // max_inflight_messages 20
					wanEndToEnd(b, m, rtt, "5", form)
				})
			}
		})
	}
}

// wanForm is how the publishing pipeline is fed.
//
//   - unbatched: producers() writers (64), one message per write, the
//     output's default max_in_flight 64: at most 64 records wait for one
//     fsync, so the writers, not the link, can set the pace.
//   - batching: the issue's measurement ("100-byte readings, `batching`
//     on, everything else default"): the output's own batching policy
//     (count 64, period 10ms) and a source that does not wait for one
//     write before it offers the next, as `generate` or an input with many
//     messages in flight: 64 × 64 writers, so each of the 64 writes in
//     flight can be a full batch.
type wanForm struct {
	batching bool
}

func (f wanForm) name(c string) string {
	if f.batching {
		return c + "/batching"
	}
	return c
}

func (f wanForm) start(b *testing.B, url string, fields ...string) *stream {
	b.Helper()
	if !f.batching {
		return startStream(b, url, fields...)
	}
	s := startStream(b, url, append(fields, "batching: { count: 64, period: 10ms }")...)
	s.sources = 64 * producers()
	return s
}

// wanProtocols are the MQTT versions of the broker and e2e cases:
// WAN_PROTOCOLS="3.1.1" selects one (default both).
func wanProtocols() []string {
	if spec := os.Getenv("WAN_PROTOCOLS"); spec != "" {
		return strings.Split(spec, ",")
	}
	return []string{"3.1.1", "5"}
}

// wanForms are the forms WAN_BATCHING selects: "unbatched", "batching" or
// both (the default), comma-separated.
func wanForms(b *testing.B) []wanForm {
	spec := os.Getenv("WAN_BATCHING")
	if spec == "" {
		spec = "unbatched,batching"
	}
	var out []wanForm
	for _, s := range strings.Split(spec, ",") {
		switch strings.TrimSpace(s) {
		case "unbatched":
			out = append(out, wanForm{})
		case "batching":
			out = append(out, wanForm{batching: true})
		default:
			b.Fatalf("WAN_BATCHING: %q is neither unbatched nor batching", s)
		}
	}
	return out
}

func wanEndToEnd(b *testing.B, m *harness.Mosquitto, rtt time.Duration, proto string, form wanForm) {
	startAcker(b, m.URL(), "bench/wan/data", "bench/wan/acks")
	s := form.start(b, wanLink(b, m, rtt).URL(), "topic: "+wanTopic, "protocol_version: "+proto,
		"confirm: end_to_end", "data_topic: bench/wan/data", "ack_topic: bench/wan/acks")
	measureLive(b, m, s, "ACKed")
}

// BenchmarkWANGoodput: confirm: broker over a 100 ms link capped at 1 and
// 10 Mbit/s each way, beside the paho baseline on the same link. goodput_%
// is payload bytes per second over the link's capacity; link_% counts the
// whole PUBLISH (publishBytes), i.e. how full the link is.
func BenchmarkWANGoodput(b *testing.B) {
	for _, mbit := range []int64{1, 10} {
		capacity := float64(mbit) * 1e6 / 8 // bytes/s
		link := func(b *testing.B, m *harness.Mosquitto) *harness.Link {
			l := wanLink(b, m, 100*time.Millisecond)
			l.Bandwidth(mbit * 1000 / 8) // KB/s
			return l
		}
		b.Run(fmt.Sprintf("mbit=%d/paho", mbit), func(b *testing.B) {
			m := broker(b)
			rate := pahoPublish(b, m, link(b, m).URL(), wanTopic, 65535)
			goodput(b, rate, capacity)
		})
		b.Run(fmt.Sprintf("mbit=%d/broker", mbit), func(b *testing.B) {
			m := broker(b)
			s := startStream(b, link(b, m).URL(), "topic: "+wanTopic)
			rate := measureLive(b, m, s, "confirmed")
			goodput(b, rate, capacity)
		})
	}
}

func goodput(b *testing.B, rate, capacity float64) {
	b.ReportMetric(100*rate*float64(len(payload100))/capacity, "goodput_%")
	b.ReportMetric(100*rate*float64(publishBytes)/capacity, "link_%")
}

// BenchmarkWANBacklog builds a b.N-record outbox while the 100 ms link is
// blackholed, lifts the blackhole and measures the drain: msgs/s from the
// first confirmation to the last, drain_s in all.
func BenchmarkWANBacklog(b *testing.B) {
	m := broker(b)
	l := wanLink(b, m, 100*time.Millisecond)
	bh := l.Blackhole()
	s := startStream(b, l.URL(), "topic: "+wanTopic)
	produce(b, s, b.N)
	if n := s.capture.confirmed.Load(); n != 0 {
		b.Fatalf("%d records confirmed through a blackhole", n)
	}
	b.ResetTimer()
	lifted := time.Now()
	l.RemoveAll(bh)
	if !s.capture.waitConfirmed(1, 2*time.Minute) {
		b.Fatal("nothing confirmed within two minutes of lifting the blackhole")
	}
	first := time.Now()
	if !s.capture.waitConfirmed(int64(b.N), waitAll) {
		b.Fatalf("only %d of %d confirmed within %s", s.capture.confirmed.Load(), b.N, waitAll)
	}
	drained := time.Now()
	b.StopTimer()
	p50, p99 := s.capture.percentiles()
	reportRate(b, b.N, drained.Sub(first), p50, p99)
	b.ReportMetric(drained.Sub(lifted).Seconds(), "drain_s")
}

// pahoPublish publishes b.N QoS 1 messages to topic through url with at
// most inFlight unconfirmed, done at the last PUBACK; it reports the rate,
// the publish-to-PUBACK latencies and the CPU use, and returns msgs/s.
func pahoPublish(b *testing.B, m *harness.Mosquitto, url, topic string, inFlight int) float64 {
	return pahoPublishEach(b, m, url, topic, inFlight, func(int) []byte { return payload100 })
}

// pahoPublishEach is pahoPublish with the i-th message's payload(i).
func pahoPublishEach(b *testing.B, m *harness.Mosquitto, url, topic string, inFlight int, payload func(i int) []byte) float64 {
	c := connect(b, url, "bench-paho", nil)
	lat := make([]int64, b.N)
	cpu := newCPUMeter(m)
	slots := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	var failed atomic.Int64
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		slots <- struct{}{}
		t0 := time.Now()
		tok := c.Publish(topic, 1, false, payload(i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !tok.WaitTimeout(waitAll) || tok.Error() != nil {
				failed.Add(1)
			}
			lat[i] = time.Since(t0).Nanoseconds()
			<-slots
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d publishes got no PUBACK", n)
	}
	p50, p99 := percentilesMs(lat)
	reportRate(b, b.N, elapsed, p50, p99)
	cpu.report(b)
	return float64(b.N) / elapsed.Seconds()
}

// BenchmarkWANInput: a manual-ack reliable_mqtt_in (no processors, a
// consumer that returns at once) over a 100 ms link, the messages
// published at the broker. On 3.1.1 the broker sends at most its
// max_inflight_messages unacknowledged, so the rate is at most that many
// per round trip: 20 → 200 msgs/s at 100 ms, and a rate near it shows the
// input adds no round trip per message. MQTT 5 sends the input's Receive
// Maximum (receive_buffer_size) instead, which mosquitto honours.
func BenchmarkWANInput(b *testing.B) {
	for _, c := range []struct {
		name     string
		proto    string
		inflight int
	}{
		{"3.1.1/max_inflight=20", "3.1.1", 20},
		{"3.1.1/max_inflight=1000", "3.1.1", 1000},
		{"5/max_inflight=20", "5", 20},
	} {
		b.Run(c.name, func(b *testing.B) {
			m := harness.StartMosquitto(b, harness.MosquittoOptions{MaxInflight: c.inflight})
			l := wanLink(b, m, 100*time.Millisecond)
			var got atomic.Int64
			sb := service.NewStreamBuilder()
			sb.SetLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
			if err := sb.AddInputYAML(fmt.Sprintf(`reliable_mqtt_in:
  urls: [ %q ]
  client_id: bench-wan-in
  topics: [ bench/wan/in ]
  qos: 1
  protocol_version: %q
`, l.URL(), c.proto)); err != nil {
				b.Fatal(err)
			}
			if err := sb.AddConsumerFunc(func(context.Context, *service.Message) error { got.Add(1); return nil }); err != nil {
				b.Fatal(err)
			}
			st, err := sb.Build()
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = st.Run(context.Background()) }()
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				_ = st.Stop(ctx)
			})
			pub := connect(b, m.URL(), "bench-wan-in-pub", nil)
			// Subscribed once a probe gets through.
			if !harness.Poll(time.Minute, func() bool {
				pub.Publish("bench/wan/in", 1, false, payload100).WaitTimeout(5 * time.Second)
				time.Sleep(300 * time.Millisecond)
				return got.Load() > 0
			}) {
				b.Fatal("the input received nothing within a minute")
			}
			time.Sleep(time.Second) // the probes' stragglers
			base := got.Load()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				pub.Publish("bench/wan/in", 1, false, payload100)
			}
			if !harness.Poll(waitAll, func() bool { return got.Load() >= base+int64(b.N) }) {
				b.Fatalf("received %d of %d within %s", got.Load()-base, b.N, waitAll)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}
