// Package bench measures reliable_mqtt_out against mosquitto on loopback,
// always beside a plain paho QoS 1 publisher measured in the same run.
// Run it with tests/bench/run.sh; see docs/performance.md for results.
//
// Every benchmark reports msgs/s and the p50/p99 confirmation latency in
// milliseconds through b.ReportMetric. No benchmark asserts a speed.
package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttout"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

const (
	// writers is the number of concurrent appenders of
	// OutboxAppend64Writers, and inFlight the number of unconfirmed
	// publishes the baseline keeps on the wire.
	writers  = 64
	inFlight = 64
	// waitAll bounds every "until everything is confirmed" wait.
	waitAll = 5 * time.Minute
)

// payload100 is 100 bytes and valid JSON (a string), so it also fits the
// end-to-end envelope.
var payload100 = []byte(`"` + strings.Repeat("x", 98) + `"`)

// broker starts a mosquitto whose limits do not cap the measurements.
func broker(b *testing.B) *harness.Mosquitto {
	return harness.StartMosquitto(b, harness.MosquittoOptions{MaxInflight: 65535})
}

func reportRate(b *testing.B, n int, elapsed time.Duration, p50, p99 float64) {
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(p50, "p50_ms")
	b.ReportMetric(p99, "p99_ms")
	b.ReportMetric(0, "ns/op") // ns/op of a whole-run measurement says nothing
}

// BenchmarkBaselinePahoQoS1 is what the broker and paho can do: QoS 1
// publishes with 64 unconfirmed on the wire, done at the PUBACK. Latency is
// publish to PUBACK.
func BenchmarkBaselinePahoQoS1(b *testing.B) {
	m := broker(b)
	pahoPublish(b, m, m.URL(), "bench/baseline", inFlight)
}

// BenchmarkOutboxAppend64Writers: durable appends only (fsync'd, group
// commit), 64 concurrent writers. Latency is Append's duration.
func BenchmarkOutboxAppend64Writers(b *testing.B) {
	ob, err := outbox.Open(filepath.Join(b.TempDir(), "outbox.db"), outbox.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer ob.Close()
	lat := make([]int64, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				_, err := ob.Append(context.Background(), outbox.Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "bench/outbox", Payload: payload100}})
				lat[i] = time.Since(t0).Nanoseconds()
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	p50, p99 := percentilesMs(lat)
	reportRate(b, b.N, elapsed, p50, p99)
}

// BenchmarkBrokerConfirm: reliable_mqtt_out (outbox on, default window) in an
// in-process stream fed by 64 concurrent producers (BENCH_PRODUCERS), from the first write
// until every record is confirmed by its PUBACK. Latency is the output's
// own publish-to-confirmation timer.
func BenchmarkBrokerConfirm(b *testing.B) {
	m := broker(b)
	measureLive(b, m, startStream(b, m.URL(), "topic: bench/confirm"), "confirmed")
}

// BenchmarkEndToEnd: confirm: end_to_end, with an ACKer of the bench's own
// that answers every ingress envelope at once. Measured from the first
// write until every record's ACK has arrived. Window 64 as elsewhere, and
// 256: an ACK's round trip is several broker hops, so by Little's law the
// window, not the CPU, can be what limits the rate.
func BenchmarkEndToEnd(b *testing.B) {
	for _, window := range []int{64, 256} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) {
			m := broker(b)
			startAcker(b, m.URL(), "bench/e2e/data", "bench/e2e/acks")
			s := startStream(b, m.URL(), "topic: bench/e2e/dest", "confirm: end_to_end",
				"data_topic: bench/e2e/data", "ack_topic: bench/e2e/acks", fmt.Sprintf("window: %d", window))
			measureLive(b, m, s, "ACKed")
		})
	}
}

// measureLive times b.N writes to s from the first one until every record
// is confirmed, and reports (and returns) the rate, s's latencies and the
// CPU use. what
// names the confirmation in the failure message ("confirmed", "ACKed").
func measureLive(b *testing.B, m *harness.Mosquitto, s *stream, what string) (msgsPerSec float64) {
	b.Helper()
	cpu := newCPUMeter(m)
	b.ResetTimer()
	start := time.Now()
	produce(b, s, b.N)
	written := time.Since(start)
	if !s.capture.waitConfirmed(int64(b.N), waitAll) {
		b.Fatalf("only %d of %d %s within %s", s.capture.confirmed.Load(), b.N, what, waitAll)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	p50, p99 := s.capture.percentiles()
	reportRate(b, b.N, elapsed, p50, p99)
	// How fast the producers' writes returned (each after its fsync): when
	// it is close to msgs/s, the producers, not the link, set the pace.
	b.ReportMetric(float64(b.N)/written.Seconds(), "written_msgs/s")
	b.ReportMetric(float64(s.capture.windowMax.Load()), "window_max")
	cpu.report(b)
	return float64(b.N) / elapsed.Seconds()
}

// BenchmarkBacklogRecovery builds a b.N-record outbox while the broker is
// unreachable (a cut proxy), then measures draining it once the path is
// restored: msgs/s from the first confirmation to the last (the drain
// rate), and reconnect_ms from the restore to the first confirmation.
// Run it with -benchtime=100000x for a 100,000-record backlog.
func BenchmarkBacklogRecovery(b *testing.B) {
	m := broker(b)
	proxy := harness.NewProxy(b, m.Addr())
	proxy.Cut()
	s := startStream(b, proxy.URL(), "topic: bench/backlog")
	produce(b, s, b.N)
	if n := s.capture.confirmed.Load(); n != 0 {
		b.Fatalf("%d records confirmed while the broker was unreachable", n)
	}
	b.ResetTimer()
	restored := time.Now()
	proxy.Restore()
	cpu := newCPUMeter(m)
	if !s.capture.waitConfirmed(1, time.Minute) {
		b.Fatal("nothing confirmed within a minute of restoring the connection")
	}
	first := time.Now()
	if !s.capture.waitConfirmed(int64(b.N), waitAll) {
		b.Fatalf("only %d of %d confirmed within %s", s.capture.confirmed.Load(), b.N, waitAll)
	}
	drained := time.Now()
	b.StopTimer()
	p50, p99 := s.capture.percentiles()
	reportRate(b, b.N, drained.Sub(first), p50, p99)
	b.ReportMetric(float64(first.Sub(restored).Milliseconds()), "reconnect_ms")
	cpu.report(b)
}

// stream is an in-process Benthos stream whose output is reliable_mqtt_out.
type stream struct {
	send    service.MessageHandlerFunc
	capture *capture
	sources int                // goroutines that write into it (produce)
	payload func(i int) []byte // the i-th message produce writes; nil: payload100
}

var streamSeq atomic.Int64

// startStream runs reliable_mqtt_out (outbox on, the output's default
// window unless fields say otherwise, producers() writes in flight) towards url; fields are extra output fields, one "key: value"
// each. The stream is stopped at cleanup.
func startStream(b *testing.B, url string, fields ...string) *stream {
	b.Helper()
	return startTracedStream(b, url, "", fields...)
}

// startTracedStream is startStream with a tracer section (YAML; "" for
// none, Benthos's default).
func startTracedStream(b *testing.B, url, tracer string, fields ...string) *stream {
	b.Helper()
	id := fmt.Sprintf("s%d", streamSeq.Add(1))
	c := newCapture(id)
	sb := service.NewStreamBuilder()
	sb.SetLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	if err := sb.SetMetricsYAML(fmt.Sprintf("bench_capture: { id: %q }", id)); err != nil {
		b.Fatal(err)
	}
	if tracer != "" {
		if err := sb.SetTracerYAML(tracer); err != nil {
			b.Fatal(err)
		}
	}
	send, err := sb.AddProducerFunc()
	if err != nil {
		b.Fatal(err)
	}
	conf := fmt.Sprintf(`reliable_mqtt_out:
  urls: [ %q ]
  max_in_flight: %d
  outbox: { path: %q }
  reconnect_backoff: { initial_interval: 20ms, max_interval: 100ms }
`, url, producers(), filepath.Join(b.TempDir(), "outbox.db"))
	for _, f := range fields {
		conf += "  " + f + "\n"
	}
	if err := sb.AddOutputYAML(conf); err != nil {
		b.Fatal(err)
	}
	st, err := sb.Build()
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = st.Run(context.Background()) }() // ended by Stop at cleanup
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = st.Stop(ctx)
	})
	return &stream{send: send, capture: c, sources: producers()}
}

// producers is how many writes a stream has in flight (its output's
// max_in_flight, the output's default 64) and how many goroutines produce
// into it: BENCH_PRODUCERS=N sets another.
func producers() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_PRODUCERS")); err == nil && n > 0 {
		return n
	}
	return 64
}

// produce writes n messages to s from s.sources concurrent writers and
// returns once every write has returned.
func produce(b *testing.B, s *stream, n int) {
	payload := s.payload
	if payload == nil {
		payload = func(int) []byte { return payload100 }
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < s.sources; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				ctx, cancel := context.WithTimeout(context.Background(), waitAll)
				err := s.send(ctx, service.NewMessage(payload(int(i-1))))
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

// connect returns a connected paho client; onConnect may subscribe.
func connect(b *testing.B, url, id string, onConnect mqtt.OnConnectHandler) mqtt.Client {
	b.Helper()
	opts := mqtt.NewClientOptions().AddBroker(url).SetClientID(id).SetCleanSession(true).
		SetOrderMatters(false).SetConnectTimeout(5 * time.Second).SetAutoReconnect(true)
	if onConnect != nil {
		opts.SetOnConnectHandler(onConnect)
	}
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(10 * time.Second) {
		b.Fatalf("connect %s to %s: no CONNACK within 10s", id, url)
	}
	if err := tok.Error(); err != nil {
		b.Fatalf("connect %s to %s: %v", id, url, err)
	}
	b.Cleanup(func() { c.Disconnect(100) })
	return c
}

// startAcker answers every ingress envelope or frame on dataTopic with the
// ACK naming it (the event's ID, or the frame's) on ackTopic, without
// waiting for the ACK's PUBACK (a fast final consumer).
func startAcker(b *testing.B, url, dataTopic, ackTopic string) {
	b.Helper()
	subscribed := make(chan error, 1)
	connect(b, url, "bench-acker", func(c mqtt.Client) {
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

// cpuMeter measures how busy the broker and this process were between
// newCPUMeter and report: on a 2-core box it shows which side saturates.
type cpuMeter struct {
	brokerPid      int
	broker0, self0 time.Duration
	start          time.Time
}

func newCPUMeter(m *harness.Mosquitto) *cpuMeter {
	return &cpuMeter{brokerPid: m.Pid(), broker0: procCPU(m.Pid()), self0: selfCPU(), start: time.Now()}
}

// report adds broker_cpu_% and self_cpu_% (100% = one core busy).
func (c *cpuMeter) report(b *testing.B) {
	wall := time.Since(c.start).Seconds()
	b.ReportMetric(100*(procCPU(c.brokerPid)-c.broker0).Seconds()/wall, "broker_cpu_%")
	b.ReportMetric(100*(selfCPU()-c.self0).Seconds()/wall, "self_cpu_%")
}

// procCPU is user+system CPU time of pid from /proc (0 if unreadable).
func procCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the ")" that ends the command name; utime and stime are
	// fields 14 and 15 of the whole line, in clock ticks (100 Hz).
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	var ut, st int64
	fmt.Sscan(fields[11], &ut)
	fmt.Sscan(fields[12], &st)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
