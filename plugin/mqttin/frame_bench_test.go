package mqttin

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"

	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/ledger"
)

// BenchmarkReceiveFrames: events/s a consumer (reliable_mqtt_in with
// envelope: ingress and ack_topic → dedup_ledger on a bbolt file → drop)
// takes from a mosquitto with its default in-flight window (20) when the
// events come one per PUBLISH and when they come 64 to a frame (zstd). The
// events wait in the consumer's session before it starts; the clock runs
// from its start to the last ACK.
//
//	go test -run '^$' -bench BenchmarkReceiveFrames -benchtime 6400x ./plugin/mqttin/
func BenchmarkReceiveFrames(b *testing.B) {
	for _, per := range []int{1, 64} {
		b.Run(fmt.Sprintf("events_per_publish=%d", per), func(b *testing.B) {
			n := (b.N + per - 1) / per * per
			m := harness.StartMosquitto(b, harness.MosquittoOptions{})
			client := "bench-frames"
			harness.Subscribe(b, m.URL(), client, false, "in/#").Close()
			var payloads [][]byte
			for start := 0; start < n; start += per {
				var events []frame.Event
				for i := start; i < start+per; i++ {
					events = append(events, frame.Event{ID: fmt.Sprintf("ev-%d", i), Topic: "dest/r",
						Payload: fmt.Appendf(nil, `{"machine":"press-1","seq":%d,"temperature":%d.%d,"humidity":%d,"state":"running"}`, i, 15+i%15, i%10, 30+i%40)})
				}
				if per == 1 {
					p, err := envelope.EncodeIngress(events[0].ID, events[0].Topic, events[0].Payload)
					if err != nil {
						b.Fatal(err)
					}
					payloads = append(payloads, p)
					continue
				}
				p, _, err := frame.Encode(events, frame.Options{Compression: frame.Zstd})
				if err != nil {
					b.Fatal(err)
				}
				payloads = append(payloads, p)
			}
			harness.Publish(b, m.URL(), "in/x", payloads)
			acks := harness.Subscribe(b, m.URL(), "bench-acks", true, "acks/t")

			b.ResetTimer()
			start := time.Now()
			st := streamtest.StartConfigQuiet(b, fmt.Sprintf(`
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: %s
    topics: [ "in/#" ]
    envelope: ingress
    ack_topic: acks/t
pipeline:
  processors:
    - dedup_ledger: { path: %q }
output:
  drop: {}
`, m.URL(), client, filepath.Join(b.TempDir(), "ledger.db")))
			ok := acks.WaitCount(len(payloads), 5*time.Minute)
			elapsed := time.Since(start)
			b.StopTimer()
			st.Stop()
			if !ok {
				b.Fatalf("%d of %d ACKs", acks.Count(), len(payloads))
			}
			b.ReportMetric(float64(n)/elapsed.Seconds(), "events/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}
