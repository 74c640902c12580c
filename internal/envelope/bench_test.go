package envelope

import "testing"

// benchReading is the ~140-byte reading tests/bench's BenchmarkPack sends.
var benchReading = []byte(`{"machine":"press-1","run_id":"20261203T230000.000Z","seq":4711,"site":"plant-a","temperature":21.3,"humidity":58,"state":"running"}`)

// BenchmarkEncodeDelivery is the per-reading work reliable_mqtt_out does
// before the outbox: strict parse plus canonical re-encoding.
func BenchmarkEncodeDelivery(b *testing.B) {
	id := NewEventID()
	b.SetBytes(int64(len(benchReading)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := EncodeDelivery(id, benchReading); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeIngress is what a consumer does per reading it receives.
func BenchmarkDecodeIngress(b *testing.B) {
	msg, err := EncodeIngress(NewEventID(), "plant-a/press-1", benchReading)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeIngress(msg); err != nil {
			b.Fatal(err)
		}
	}
}
