package bench

import (
	"strings"
	"testing"
)

// BenchmarkProtocol measures the same outputs over MQTT 3.1.1 and MQTT 5,
// in one run against one kind of broker, so the two protocols compare
// directly: confirm: broker (also with envelope: properties, the event ID
// as a user property on every publish), and confirm: end_to_end with the
// JSON ingress envelope and the bench's ACKer (window 64). 3.1.1 is the
// default, so its rows set no protocol_version.
//
//	go test -run '^$' -bench '^BenchmarkProtocol$' -benchtime=50000x ./tests/bench/
func BenchmarkProtocol(b *testing.B) {
	v5 := `protocol_version: "5"`
	for _, c := range []struct {
		name   string
		fields []string
	}{
		{"BrokerConfirm/protocol=3.1.1", nil},
		{"BrokerConfirm/protocol=5", []string{v5}},
		{"BrokerConfirm/protocol=5,envelope=properties", []string{v5, "envelope: properties"}},
		{"EndToEnd/protocol=3.1.1", nil},
		{"EndToEnd/protocol=5", []string{v5}},
	} {
		b.Run(c.name, func(b *testing.B) {
			m := broker(b)
			fields := append([]string{"topic: bench/protocol"}, c.fields...)
			what := "confirmed"
			if strings.HasPrefix(c.name, "EndToEnd/") {
				startAcker(b, m.URL(), "bench/protocol/data", "bench/protocol/acks")
				fields = append(fields, "confirm: end_to_end", "data_topic: bench/protocol/data", "ack_topic: bench/protocol/acks")
				what = "ACKed"
			}
			measureLive(b, m, startStream(b, m.URL(), fields...), what)
		})
	}
}
