package mqttout_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttin"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// quiet is how long a test watches for something that must not happen:
// long enough to catch a premature ACK, never a condition to wait for.
const quiet = 500 * time.Millisecond

// A bridge (reliable_mqtt_in with envelope: ingress and ack_topic →
// reliable_mqtt_out in direct mode, end to end, pack.max_events 64) that
// receives a frame of 100 events forwards it as two frames of 64 and 36,
// one PUBLISH each, every event keeping its ID, destination topic and
// payload in order, and its own trace (its forwarded trace context
// continues the trace it came with); it ACKs the source frame once, and
// only after the consumer ACKed both forwarded frames.
func TestADirectOutputForwardsAFrameAsFramesAndACKsItsSourceLast(t *testing.T) {
	src := harness.StartMosquitto(t, harness.MosquittoOptions{MaxInflight: 1000})
	dst := harness.StartMosquitto(t, harness.MosquittoOptions{MaxInflight: 1000})
	srcAcks := harness.Subscribe(t, src.URL(), "source-ack-watcher", true, "reliable/acks")
	consumer := harness.Subscribe(t, dst.URL(), "consumer", true, "reliable/deliveries")
	// The bridge's session exists before the frame is published.
	harness.Subscribe(t, src.URL(), "bridge-in", false, "reliable/ingress").Close()

	s := streamtest.StartConfig(t, fmt.Sprintf(`
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: bridge-in
    topics: [ reliable/ingress ]
    envelope: ingress
    ack_topic: reliable/acks
tracer:
  test_recorder: {}
output:
  reliable_mqtt_out:
    urls: [ %q ]
    topic: ${! meta("destination_topic") }
    event_id: ${! meta("event_id") }
    confirm: end_to_end
    data_topic: reliable/deliveries
    ack_topic: reliable/consumer-acks
    ack_timeout: 60s
    outbox: { enabled: false }
    pack: { max_events: 64 }
    trace_context: envelope
`, src.URL(), dst.URL()))
	defer func() {
		s.Stop()
		if t.Failed() {
			t.Logf("stream log:\n%s", harness.TailLines(s.Logs.String(), 40))
		}
	}()

	var sent []frame.Event
	for i := 1; i <= 100; i++ {
		sent = append(sent, frame.Event{ID: fmt.Sprintf("ev-%d", i), Topic: fmt.Sprintf("plant/%d", i%3), Payload: fmt.Appendf(nil, `{"n":%d}`, i),
			Trace: map[string]string{frame.KeyTraceparent: fmt.Sprintf("00-%032x-%016x-01", i, i)}})
	}
	raw, sourceID, err := frame.Encode(sent, frame.Options{Compression: frame.Zstd})
	if err != nil {
		t.Fatal(err)
	}
	harness.Publish(t, src.URL(), "reliable/ingress", [][]byte{raw})

	harness.Eventually(t, waitLong, "two forwarded PUBLISHes", func() bool { return consumer.Count() >= 2 })
	type forwarded struct {
		id     string
		events []frame.Event
	}
	var frames []forwarded
	for _, m := range consumer.Messages() {
		id, events, err := frame.Decode(m.Payload, frame.DefaultLimits)
		if err != nil {
			t.Fatalf("a forwarded PUBLISH is not a frame: %v", err)
		}
		frames = append(frames, forwarded{id, events})
	}
	// The two frames are published concurrently: either may come first.
	slices.SortFunc(frames, func(a, b forwarded) int { return len(b.events) - len(a.events) })
	var got []frame.Event
	var ids []string
	for _, f := range frames {
		ids, got = append(ids, f.id), append(got, f.events...)
	}
	if len(ids) != 2 || len(got) != 100 || len(frames[0].events) != 64 {
		t.Fatalf("%d PUBLISHes carrying %d events, want 2 frames (64 and 36) carrying 100", len(ids), len(got))
	}
	for i, e := range got {
		if e.ID != sent[i].ID || e.Topic != sent[i].Topic || string(e.Payload) != string(sent[i].Payload) {
			t.Fatalf("forwarded event %d is %s to %q (%s), want %s to %q (%s)", i, e.ID, e.Topic, e.Payload, sent[i].ID, sent[i].Topic, sent[i].Payload)
		}
		// 00-<trace ID>-<span ID>-<flags>: the same trace, a span of the bridge.
		in, out := sent[i].Trace[frame.KeyTraceparent], e.Trace[frame.KeyTraceparent]
		if len(out) != len(in) || out[3:35] != in[3:35] || out == in {
			t.Fatalf("event %s forwarded with traceparent %q, want a span of its own trace %q", e.ID, out, in)
		}
	}

	sourceACKs := func() []string {
		var out []string
		for _, m := range srcAcks.Messages() {
			id, err := envelope.DecodeAck(m.Payload)
			if err != nil {
				t.Fatalf("a malformed ACK on the source: %v", err)
			}
			out = append(out, id)
		}
		return out
	}
	ack := func(id string) {
		b, err := envelope.EncodeAck(id)
		if err != nil {
			t.Fatal(err)
		}
		harness.Publish(t, dst.URL(), "reliable/consumer-acks", [][]byte{b})
	}
	time.Sleep(quiet)
	if a := sourceACKs(); len(a) != 0 {
		t.Fatalf("the source got ACKs %v before the consumer ACKed anything", a)
	}
	ack(ids[0])
	time.Sleep(quiet)
	if a := sourceACKs(); len(a) != 0 {
		t.Fatalf("the source got ACKs %v with one of the two frames ACKed", a)
	}
	ack(ids[1])
	harness.Eventually(t, waitLong, "the source frame's ACK", func() bool { return len(sourceACKs()) > 0 })
	time.Sleep(quiet)
	if a := sourceACKs(); !slices.Equal(a, []string{sourceID}) {
		t.Fatalf("source ACKs %v, want one naming the source frame %s", a, sourceID)
	}
	if n := consumer.Count(); n != 2 {
		t.Fatalf("%d PUBLISHes at the destination, want the 2 frames once each", n)
	}
}
