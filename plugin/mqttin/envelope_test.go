package mqttin

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

func mustIngress(t *testing.T, id, dest, payload string) string {
	t.Helper()
	b, err := envelope.EncodeIngress(id, dest, []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustAck(t *testing.T, id string) string {
	t.Helper()
	b, err := envelope.EncodeAck(id)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ackExpectFirstACK acknowledges a decoded message and waits for the first
// end-to-end ACK on acks, which must be the canonical ACK of id.
func ackExpectFirstACK(t *testing.T, ack service.AckFunc, acks *harness.Subscriber, id string) {
	t.Helper()
	if err := ack(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if !acks.WaitCount(1, 5*time.Second) {
		t.Fatal("no ACK published to ack_topic")
	}
	if got, want := string(acks.Messages()[0].Payload), mustAck(t, id); got != want {
		t.Fatalf("ACK = %s, want %s", got, want)
	}
}

// An ingress envelope becomes its inner payload with event_id and
// destination_topic; after the pipeline acks, the canonical ACK is published
// to ack_topic. With on_malformed: flag a malformed envelope reaches the
// pipeline flagged with an error, gets no end-to-end ACK, and is still
// PUBACKed once the pipeline acknowledged it (e.g. a dead-letter output
// succeeded).
func TestIngressEnvelopeDecodedAndAckedEndToEnd(t *testing.T) {
	b := startBroker(t)
	acks := harness.Subscribe(t, b.URL(), "ack-watcher", true, "acks/t")
	topics := []string{"in/#", "t/#"}
	extra := []string{"envelope: ingress", "ack_topic: acks/t", "on_malformed: flag"}
	ti := openInput(t, inputYAML(b.URL(), "ingress", topics, extra...))

	malformed := []string{
		`{"event_id":"ev-2","payload":1,"topic":"dest/y","version":2}`,  // wrong version
		`{"event_id":"ev-3","payload":1,"topic":"dest/#","version":1}`,  // wildcard destination
		`{"event_id":"ev-4","payload":1,"version":1}`,                   // a delivery envelope
		`{"event_id":"ev-5","payload":1,"topic":"d","version":1,"x":0}`, // extra key
		`not json`,
	}
	publish(t, b.URL(), "in/x", append([]string{mustIngress(t, "ev-1", "dest/x", `{"b": 2, "a": 1}`)}, malformed...)...)

	msg, ack := ti.read()
	if err := msg.GetError(); err != nil {
		t.Fatalf("valid envelope flagged: %v", err)
	}
	if got := body(msg); got != `{"a":1,"b":2}` {
		t.Fatalf("body = %q, want the canonical inner payload", got)
	}
	if meta(msg, metaEventID) != "ev-1" || meta(msg, metaDestTopic) != "dest/x" {
		t.Fatalf("event_id = %q, destination_topic = %q", meta(msg, metaEventID), meta(msg, metaDestTopic))
	}
	ackExpectFirstACK(t, ack, acks, "ev-1")

	for _, raw := range malformed {
		msg, ack := ti.read()
		if msg.GetError() == nil {
			t.Fatalf("malformed envelope %s not flagged with an error", raw)
		}
		if body(msg) != raw {
			t.Fatalf("malformed envelope body = %q, want it unchanged", body(msg))
		}
		if _, ok := msg.MetaGet(metaEventID); ok {
			t.Fatalf("malformed envelope %s carries event_id", raw)
		}
		_ = ack(context.Background(), nil) // e.g. the dead-letter output succeeded
	}
	time.Sleep(300 * time.Millisecond) // an ACK for a malformed envelope would arrive by now
	if n := acks.Count(); n != 1 {
		t.Fatalf("%d ACKs published, want 1: malformed envelopes must never be acknowledged end to end", n)
	}
	ti.closeExpectMarkerFirst(b, "ingress", topics, extra...)
}

func TestDeliveryEnvelopeDecoded(t *testing.T) {
	b := startBroker(t)
	ti := openInput(t, inputYAML(b.URL(), "delivery", []string{"d/#"}, "envelope: delivery", "on_malformed: flag"))
	del, err := envelope.EncodeDelivery("ev-9", []byte(`[1,"x"]`))
	if err != nil {
		t.Fatal(err)
	}
	publish(t, b.URL(), "d/x", string(del), mustIngress(t, "ev-10", "dest", "1"))

	msg, ack := ti.read()
	if msg.GetError() != nil || body(msg) != `[1,"x"]` || meta(msg, metaEventID) != "ev-9" {
		t.Fatalf("delivery envelope decoded to body %q event_id %q error %v", body(msg), meta(msg, metaEventID), msg.GetError())
	}
	if _, ok := msg.MetaGet(metaDestTopic); ok {
		t.Fatal("a delivery envelope has no destination_topic")
	}
	_ = ack(context.Background(), nil)
	msg, ack = ti.read()
	if msg.GetError() == nil {
		t.Fatal("an ingress envelope must not pass as a delivery envelope")
	}
	_ = ack(context.Background(), nil)
}

// By default a malformed envelope never reaches the pipeline: it is
// acknowledged at the source (the marker comes first on the next session),
// counted, logged, and produces no end-to-end ACK; the valid envelope
// behind it is delivered.
func TestMalformedEnvelopeIsDroppedAcknowledgedAndLoggedByDefault(t *testing.T) {
	b := startBroker(t)
	acks := harness.Subscribe(t, b.URL(), "ack-watcher", true, "acks/t")
	topics := []string{"in/#", "t/#"}
	extra := []string{"envelope: ingress", "ack_topic: acks/t"}
	ti := openInput(t, inputYAML(b.URL(), "dropmal", topics, extra...))
	publish(t, b.URL(), "in/x", `not json`, `{"event_id":"ev-2","payload":1,"topic":"dest/#","version":1}`, mustIngress(t, "ev-3", "dest/x", `"ok"`))

	msg, ack := ti.read()
	if msg.GetError() != nil || meta(msg, metaEventID) != "ev-3" {
		t.Fatalf("first message read: event_id %q error %v; want ev-3, the malformed ones dropped", meta(msg, metaEventID), msg.GetError())
	}
	_ = ack(context.Background(), nil)
	if !acks.WaitCount(1, 5*time.Second) {
		t.Fatal("no ACK for ev-3")
	}
	if !ti.logs.Contains("dropped and acknowledged (on_malformed: drop)") || !ti.logs.Contains(`dest/#`) {
		t.Fatalf("no warning naming the dropped envelopes; logs:\n%s", ti.logs.String())
	}
	if n := acks.Count(); n != 1 {
		t.Fatalf("%d ACKs published, want 1 (ev-3 only)", n)
	}
	ti.closeExpectMarkerFirst(b, "dropmal", topics) // envelope: none, so the marker is read as is
}

// With ack_auth_key the ACK carries the lowercase hex HMAC-SHA256 of the
// event ID (computed here with the standard library, not the plugin's
// code); without it the ACK stays the reliomq v1 bytes (the test above).
func TestAckCarriesHMACWhenAckAuthKeyIsSet(t *testing.T) {
	b := startBroker(t)
	acks := harness.Subscribe(t, b.URL(), "ack-watcher", true, "acks/t")
	ti := openInput(t, inputYAML(b.URL(), "authack", []string{"in/#"}, "envelope: ingress", "ack_topic: acks/t", "ack_auth_key: s3cret"))
	publish(t, b.URL(), "in/x", mustIngress(t, "ev-7", "dest/x", `1`))
	_, ack := ti.read()
	_ = ack(context.Background(), nil)
	if !acks.WaitCount(1, 5*time.Second) {
		t.Fatal("no ACK published")
	}
	mac := hmac.New(sha256.New, []byte("s3cret"))
	mac.Write([]byte("ev-7"))
	want := `{"auth":"` + hex.EncodeToString(mac.Sum(nil)) + `","event_id":"ev-7","version":1}`
	if got := string(acks.Messages()[0].Payload); got != want {
		t.Fatalf("ACK = %s\nwant  %s", got, want)
	}
}

// When the end-to-end ACK cannot be published, the source is not
// acknowledged: the attempt counts as rejected and is retried, and the
// broker redelivers the source after the connection is gone.
func TestAckPublishFailureLeavesSourceUnacked(t *testing.T) {
	b := startBroker(t)
	proxy := harness.NewProxy(t, b.Addr())
	acks := harness.Subscribe(t, b.URL(), "ack-watcher", true, "acks/t")
	topics := []string{"in/#", "t/#"}
	extra := []string{"envelope: ingress", "ack_topic: acks/t", "ack_publish_timeout: 300ms"}
	ti := openInput(t, inputYAML(proxy.URL(), "ackfail", topics, extra...))
	publish(t, b.URL(), "in/x", mustIngress(t, "ev-1", "dest/x", `"v"`))

	_, ack := ti.read()
	firstConn := ti.in.client.Current()
	proxy.Stall() // the ACK's PUBACK can no longer arrive
	_ = ack(context.Background(), nil)

	// The attempt failed: the input delivers the message again.
	msg, ack := ti.read()
	if meta(msg, metaEventID) != "ev-1" {
		t.Fatalf("retry carries event_id %q", meta(msg, metaEventID))
	}
	proxy.Cut() // whatever the stall withheld is discarded with the connection
	harness.Eventually(t, 5*time.Second, "the input notices the cut", func() bool { return !firstConn.Alive() })
	proxy.Restore()
	_ = ack(context.Background(), nil) // its connection is gone: dropped, the broker redelivers

	msg, ack = ti.read()
	if meta(msg, metaEventID) != "ev-1" || meta(msg, metaDuplicate) != "true" {
		t.Fatalf("expected the broker's redelivery of ev-1, got event_id %q dup %q", meta(msg, metaEventID), meta(msg, metaDuplicate))
	}
	_ = ack(context.Background(), nil)
	if !acks.WaitCount(1, 5*time.Second) {
		t.Fatal("no ACK published after the connection came back")
	}
	ti.closeExpectMarkerFirst(b, "ackfail", topics) // envelope: none, so the marker is read as is
}
