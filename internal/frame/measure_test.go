package frame

import (
	"bytes"
	"compress/flate"
	"fmt"
	"math/rand"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
)

// readings returns n events as a sensor gateway sends them: ~140-byte JSON
// readings of 8 devices, version 7 UUID event IDs, a destination topic
// per device (as through a bridge). seed makes them repeatable.
func readings(n int, seed int64) []Event {
	r := rand.New(rand.NewSource(seed))
	events := make([]Event, n)
	for i := range events {
		dev := r.Intn(8)
		p := fmt.Sprintf(`{"device":"sensor-%04d","seq":%d,"ts":"2026-12-03T23:%02d:%02d.%03dZ","temp_c":%.2f,"humidity_pct":%.1f,"pressure_hpa":%.2f,"battery_v":%.2f}`,
			40+dev, 100000+i, r.Intn(60), r.Intn(60), r.Intn(1000), 15+r.Float64()*10, 30+r.Float64()*40, 990+r.Float64()*40, 3.3+r.Float64()*0.9)
		events[i] = Event{ID: envelope.NewEventID(), Topic: fmt.Sprintf("site/3/sensor-%04d/reading", 40+dev), Payload: []byte(p)}
	}
	return events
}

// deflater is reused as the zstd encoder is (tests here run one at a time).
var deflater *flate.Writer

// deflated is the frame's size were its body deflated instead (same
// header, same declared length).
func deflated(t testing.TB, events []Event) int {
	b, _, err := Encode(events, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if deflater == nil {
		deflater, _ = flate.NewWriter(&buf, flate.DefaultCompression)
	}
	w := deflater
	w.Reset(&buf)
	w.Write(b[headerLen:])
	w.Close()
	return headerLen + len(uv(uint64(len(b)-headerLen))) + buf.Len()
}

// TestCompressionBytesPerReading measures frame bytes per reading with no
// compression, deflate and zstd at 16, 64 and 100 readings per frame
// (docs/frames.md gives the figures: go test -run
// TestCompressionBytesPerReading -v ./internal/frame/), and holds the
// choice the page explains: zstd is smaller than deflate at every size.
func TestCompressionBytesPerReading(t *testing.T) {
	var payload int
	for _, e := range readings(1000, 1) {
		payload += len(e.Payload)
	}
	t.Logf("readings: %.1f bytes of JSON each on average; event ID 32 bytes; topic ~25 bytes", float64(payload)/1000)
	t.Logf("%8s %8s %8s %8s", "events", "none", "deflate", "zstd")
	for _, n := range []int{16, 64, 100} {
		var none, defl, zs int
		const frames = 20
		for f := 0; f < frames; f++ {
			events := readings(n, int64(f+1))
			b, _, err := Encode(events, Options{})
			if err != nil {
				t.Fatal(err)
			}
			z, _, err := Encode(events, Options{Compression: Zstd})
			if err != nil {
				t.Fatal(err)
			}
			none += len(b)
			zs += len(z)
			defl += deflated(t, events)
		}
		per := func(total int) float64 { return float64(total) / float64(frames*n) }
		t.Logf("%8d %8.1f %8.1f %8.1f", n, per(none), per(defl), per(zs))
		if zs >= defl {
			t.Errorf("%d events per frame: zstd %.1f bytes/reading, deflate %.1f: zstd no longer wins", n, per(zs), per(defl))
		}
	}
}

// BenchmarkEncode and BenchmarkDecode: the CPU a 64-reading frame costs
// (deflate: the uncompressed frame, then its body deflated).
func BenchmarkEncode(b *testing.B) {
	b.Run("deflate", func(b *testing.B) {
		events := readings(64, 1)
		for i := 0; i < b.N; i++ {
			deflated(b, events)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*64), "ns/reading")
	})
	for _, c := range []string{None, Zstd} {
		b.Run(c, func(b *testing.B) {
			events := readings(64, 1)
			for i := 0; i < b.N; i++ {
				if _, _, err := Encode(events, Options{Compression: c}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*64), "ns/reading")
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, c := range []string{None, Zstd} {
		b.Run(c, func(b *testing.B) {
			f, _, err := Encode(readings(64, 1), Options{Compression: c})
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < b.N; i++ {
				if _, _, err := Decode(f, DefaultLimits); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*64), "ns/reading")
		})
	}
}
