package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
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
// The end-to-end consumer is the bench's own ACKer, which reads frames and
// envelopes and ACKs each at once. A byte-counting proxy on the publisher's
// link gives link bytes per reading (up: publisher to broker; down: back),
// and the broker's CPU time per reading is read from /proc.
//
//	go test -run '^$' -bench BenchmarkPack -benchtime 100000x ./tests/bench/
func BenchmarkPack(b *testing.B) {
	b.Run("paho_qos1", func(b *testing.B) {
		m := broker(b)
		proxy := harness.NewProxy(b, m.Addr())
		c := connect(b, proxy.URL(), "bench-paho-pack", nil)
		slots := make(chan struct{}, 65535)
		var wg sync.WaitGroup
		var failed atomic.Int64
		lm := startLinkMeter(m, proxy)
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			slots <- struct{}{}
			tok := c.Publish("bench/pack/dest", 1, false, reading(i))
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !tok.WaitTimeout(waitAll) || tok.Error() != nil {
					failed.Add(1)
				}
				<-slots
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		if n := failed.Load(); n > 0 {
			b.Fatalf("%d publishes got no PUBACK", n)
		}
		reportRate(b, b.N, elapsed, 0, 0)
		lm.report(b)
	})
	for _, packed := range []bool{false, true} {
		name := map[bool]string{false: "unpacked", true: "packed"}[packed]
		b.Run(name, func(b *testing.B) {
			m := broker(b)
			proxy := harness.NewProxy(b, m.Addr())
			startFrameAcker(b, m.URL(), "bench/pack/data", "bench/pack/acks")
			fields := []string{"topic: bench/pack/dest", "confirm: end_to_end", "data_topic: bench/pack/data", "ack_topic: bench/pack/acks", "batching: { count: 64, period: 2ms }"}
			if packed {
				fields = append(fields, "pack: { max_events: 64 }")
			}
			s := startStream(b, proxy.URL(), fields...)
			lm := startLinkMeter(m, proxy)
			b.ResetTimer()
			start := time.Now()
			produceReadings(b, s, b.N)
			written := time.Since(start)
			if !s.capture.waitConfirmed(int64(b.N), waitAll) {
				b.Fatalf("only %d of %d ACKed within %s", s.capture.confirmed.Load(), b.N, waitAll)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			p50, p99 := s.capture.percentiles()
			reportRate(b, b.N, elapsed, p50, p99)
			// Writes return after their fsync: when this is close to msgs/s,
			// the producers, not the link, set the pace.
			b.ReportMetric(float64(b.N)/written.Seconds(), "written_msgs/s")
			b.ReportMetric(float64(s.capture.windowMax.Load()), "window_max")
			lm.report(b)
		})
	}
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

// produceReadings writes readings 0..n-1 to s from s.sources concurrent
// writers.
func produceReadings(b *testing.B, s *stream, n int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < s.sources; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), waitAll)
				err := s.send(ctx, service.NewMessage(reading(int(i))))
				cancel()
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// startFrameAcker answers every frame and every ingress envelope on
// dataTopic with the ACK that names it (the frame's ID, or the event's),
// without waiting for the ACK's PUBACK.
func startFrameAcker(b *testing.B, url, dataTopic, ackTopic string) {
	b.Helper()
	subscribed := make(chan error, 1)
	connect(b, url, "bench-frame-acker", func(c mqtt.Client) {
		tok := c.Subscribe(dataTopic, 1, func(c mqtt.Client, m mqtt.Message) {
			var id string
			if frame.Is(m.Payload()) {
				fid, _, err := frame.Decode(m.Payload(), frame.DefaultLimits)
				if err != nil {
					return
				}
				id = fid
			} else {
				in, err := envelope.DecodeIngress(m.Payload())
				if err != nil {
					return
				}
				id = in.EventID
			}
			ack, _ := envelope.EncodeAck(id)
			c.Publish(ackTopic, 1, false, ack)
		})
		err := fmt.Errorf("no SUBACK within 10s")
		if tok.WaitTimeout(10 * time.Second) {
			err = tok.Error()
		}
		select {
		case subscribed <- err:
		default:
		}
	})
	select {
	case err := <-subscribed:
		if err != nil {
			b.Fatalf("acker: subscribe %s at %s: %v", dataTopic, url, err)
		}
	case <-time.After(11 * time.Second):
		b.Fatalf("acker: subscribe %s at %s did not finish", dataTopic, url)
	}
}
