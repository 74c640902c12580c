package mqttin

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// frameEvents are three events as a bridge's publisher packs them.
func frameEvents() []frame.Event {
	return []frame.Event{
		{ID: "ev-1", Topic: "dest/a", Payload: []byte(`{"n":1}`), Properties: []frame.Property{{Key: "unit", Value: "C"}},
			Trace: map[string]string{frame.KeyTraceparent: traceparent}},
		{ID: "ev-2", Topic: "dest/b", Payload: []byte(`{"n":2}`), Properties: []frame.Property{{Key: "site", Value: "3"}, {Key: "site", Value: "4"}}},
		{ID: "ev-3", Topic: "dest/c", Payload: []byte(`{"n":3}`)},
	}
}

func mustFrame(t *testing.T, events []frame.Event, compression string) ([]byte, string) {
	t.Helper()
	b, id, err := frame.Encode(events, frame.Options{Compression: compression})
	if err != nil {
		t.Fatal(err)
	}
	return b, id
}

// A frame received with envelope: ingress becomes one batch, a message per
// event with that event's payload, event_id, destination_topic and user
// properties (the PUBLISH's metadata besides, and frame_id); after the
// pipeline acknowledges the batch, ONE end-to-end ACK names the frame (its
// HMAC over the frame ID), then the PUBACK (the marker comes first on the
// next session).
func TestFrameBecomesOneBatchAndOneACK(t *testing.T) {
	for _, compression := range []string{frame.None, frame.Zstd} {
		t.Run(compression, func(t *testing.T) {
			b := startBroker(t)
			acks := harness.Subscribe(t, b.URL(), "ack-watcher", true, "acks/t")
			topics := []string{"in/#", "t/#"}
			ti := openInput(t, inputYAML(b.URL(), "frames", topics, "envelope: ingress", "ack_topic: acks/t", "ack_auth_key: s3cret"))
			raw, id := mustFrame(t, frameEvents(), compression)
			harness.Publish(t, b.URL(), "in/x", [][]byte{raw})

			batch, ack := ti.readBatch()
			if len(batch) != 3 {
				t.Fatalf("batch of %d messages, want 3", len(batch))
			}
			for k, e := range frameEvents() {
				msg := batch[k]
				if err := msg.GetError(); err != nil {
					t.Fatalf("event %s flagged: %v", e.ID, err)
				}
				if body(msg) != string(e.Payload) || meta(msg, metaEventID) != e.ID || meta(msg, metaDestTopic) != e.Topic {
					t.Errorf("message %d: body %q event_id %q destination_topic %q, want %s", k, body(msg), meta(msg, metaEventID), meta(msg, metaDestTopic), e.ID)
				}
				if meta(msg, metaFrameID) != id || meta(msg, metaTopic) != "in/x" || meta(msg, metaQoS) != "1" {
					t.Errorf("message %d: frame_id %q mqtt_topic %q mqtt_qos %q", k, meta(msg, metaFrameID), meta(msg, metaTopic), meta(msg, metaQoS))
				}
				if commit.HooksFrom(msg.Context()) == nil {
					t.Errorf("message %d has no delivery hooks", k)
				}
			}
			if meta(batch[0], "mqtt_user_property_unit") != "C" {
				t.Errorf("event 1's user property unit = %q", meta(batch[0], "mqtt_user_property_unit"))
			}
			if v, _ := batch[1].MetaGetMut("mqtt_user_property_site"); len(v.([]any)) != 2 {
				t.Errorf("event 2's repeated user property site = %v, want both values", v)
			}
			if _, ok := batch[2].MetaGet("mqtt_user_property_unit"); ok {
				t.Error("event 3 carries event 1's user property")
			}
			if commit.HooksFrom(batch[0].Context()) == commit.HooksFrom(batch[1].Context()) {
				t.Error("two events share one hook list")
			}
			if err := ack(context.Background(), nil); err != nil {
				t.Fatal(err)
			}
			if !acks.WaitCount(1, 5*time.Second) {
				t.Fatal("no ACK published for the frame")
			}
			mac := hmac.New(sha256.New, []byte("s3cret"))
			mac.Write([]byte(id))
			want := `{"auth":"` + hex.EncodeToString(mac.Sum(nil)) + `","event_id":"` + id + `","version":1}`
			time.Sleep(300 * time.Millisecond) // an ACK per event would have arrived by now
			if n := acks.Count(); n != 1 || string(acks.Messages()[0].Payload) != want {
				t.Fatalf("%d ACKs, the first %s; want one: %s", n, acks.Messages()[0].Payload, want)
			}
			ti.closeExpectMarkerFirst(b, "frames", topics)
		})
	}
}

// failing returns a BatchError that fails message k of batch only.
func failing(batch service.MessageBatch, k int) error {
	return service.NewBatchError(batch, errors.New("one event failed")).Failed(k, errors.New("event failed"))
}

// When one event of a frame fails, nothing of the frame is acknowledged
// (no ACK, no PUBACK) and the whole frame comes again; each event's hooks
// saw its own result (the others succeeded). When all succeed, one ACK,
// then the PUBACK.
func TestFrameWithAFailedEventComesBackWhole(t *testing.T) {
	b := startBroker(t)
	acks := harness.Subscribe(t, b.URL(), "ack-watcher", true, "acks/t")
	topics := []string{"in/#", "t/#"}
	ti := openInput(t, inputYAML(b.URL(), "partial", topics, "envelope: ingress", "ack_topic: acks/t", "retry_backoff:\n  initial_interval: 10ms\n  max_interval: 50ms"))
	raw, id := mustFrame(t, frameEvents(), frame.Zstd)
	harness.Publish(t, b.URL(), "in/x", [][]byte{raw})

	batch, ack := ti.readBatch()
	seen := make([]error, len(batch))
	ran := make([]bool, len(batch))
	for k, msg := range batch {
		if err := commit.HooksFrom(msg.Context()).Register(func(_ context.Context, result error) error {
			seen[k], ran[k] = result, true
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	_ = ack(context.Background(), failing(batch, 1))
	for k := range batch {
		if !ran[k] || (seen[k] != nil) != (k == 1) {
			t.Fatalf("event %d's hook ran %v with %v; want only event 2's with its failure", k+1, ran[k], seen[k])
		}
	}

	batch, ack = ti.readBatch()
	if len(batch) != 3 || meta(batch[0], metaEventID) != "ev-1" || meta(batch[2], metaEventID) != "ev-3" {
		t.Fatalf("the retried frame has %d messages", len(batch))
	}
	if acks.Count() != 0 {
		t.Fatal("an ACK went out for a frame with a failed event")
	}
	_ = ack(context.Background(), nil)
	if !acks.WaitCount(1, 5*time.Second) || string(acks.Messages()[0].Payload) != mustAck(t, id) {
		t.Fatalf("ACK after the retry: %v", acks.Messages())
	}
	ti.closeExpectMarkerFirst(b, "partial", topics)
}

// A frame that is not valid, and a decompression bomb, are never
// expanded: with on_malformed: flag each reaches the pipeline as ONE
// message, its bytes unchanged and flagged, without event_id, and gets no
// end-to-end ACK; the valid frame behind them is delivered. With
// envelope: ingress an event without a destination topic makes its frame
// malformed.
func TestMalformedFrameAndBombAreFlaggedUnexpanded(t *testing.T) {
	b := startBroker(t)
	acks := harness.Subscribe(t, b.URL(), "ack-watcher", true, "acks/t")
	ti := openInput(t, inputYAML(b.URL(), "badframes", []string{"in/#"}, "envelope: ingress", "ack_topic: acks/t", "on_malformed: flag"))
	good, id := mustFrame(t, frameEvents(), frame.None)
	noTopic, _ := mustFrame(t, []frame.Event{{ID: "x", Payload: []byte("1")}}, frame.None)
	bad := append(append([]byte(nil), good...), 0) // a trailing byte
	bomb := bombFrame()
	harness.Publish(t, b.URL(), "in/x", [][]byte{bad, bomb, noTopic, good})

	for _, raw := range [][]byte{bad, bomb, noTopic} {
		batch, ack := ti.readBatch()
		if len(batch) != 1 {
			t.Fatalf("a malformed frame became %d messages", len(batch))
		}
		msg := batch[0]
		if msg.GetError() == nil || body(msg) != string(raw) {
			t.Fatalf("malformed frame: error %v, body unchanged %v", msg.GetError(), body(msg) == string(raw))
		}
		if _, ok := msg.MetaGet(metaEventID); ok {
			t.Fatal("a malformed frame carries event_id")
		}
		t.Logf("flagged: %v", msg.GetError())
		_ = ack(context.Background(), nil) // the dead-letter output succeeded
	}
	batch, ack := ti.readBatch()
	if len(batch) != 3 {
		t.Fatalf("the valid frame became %d messages", len(batch))
	}
	_ = ack(context.Background(), nil)
	if !acks.WaitCount(1, 5*time.Second) {
		t.Fatal("no ACK for the valid frame")
	}
	time.Sleep(300 * time.Millisecond)
	if n := acks.Count(); n != 1 || string(acks.Messages()[0].Payload) != mustAck(t, id) {
		t.Fatalf("%d ACKs; want only the valid frame's", n)
	}
}

// bombFrame is a frame whose zstd body declares 1000 bytes and expands to
// 1 GiB of zeros (RLE blocks).
func bombFrame() []byte {
	b := append([]byte(frame.Magic), frame.Version, 1)
	b = binary.AppendUvarint(b, 1000)
	b = append(b, 0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x38)
	const blocks = 8192
	for i := 0; i < blocks; i++ {
		h := uint32(128<<10)<<3 | 1<<1
		if i == blocks-1 {
			h |= 1
		}
		b = append(b, byte(h), byte(h>>8), byte(h>>16), 0)
	}
	return b
}

// With on_malformed: drop (the default) a malformed frame is acknowledged
// at the source, logged and never delivered.
func TestMalformedFrameIsDroppedByDefault(t *testing.T) {
	b := startBroker(t)
	ti := openInput(t, inputYAML(b.URL(), "dropframe", []string{"in/#"}, "envelope: delivery"))
	good, _ := mustFrame(t, []frame.Event{{ID: "d-1", Payload: []byte("1")}}, frame.None)
	harness.Publish(t, b.URL(), "in/x", [][]byte{bombFrame(), good})
	batch, ack := ti.readBatch()
	if len(batch) != 1 || meta(batch[0], metaEventID) != "d-1" || batch[0].GetError() != nil {
		t.Fatalf("first delivery: %d messages, event_id %q; want the valid frame, the bomb dropped", len(batch), meta(batch[0], metaEventID))
	}
	_ = ack(context.Background(), nil)
	if !ti.logs.Contains("is not a valid frame") || !ti.logs.Contains("dropped and acknowledged (on_malformed: drop)") {
		t.Fatalf("no warning for the dropped frame; logs:\n%s", ti.logs.String())
	}
}

// With envelope: none a frame is a payload like any other: one message,
// its bytes unchanged, never unpacked.
func TestEnvelopeNoneKeepsAFrameOpaque(t *testing.T) {
	b := startBroker(t)
	ti := openInput(t, inputYAML(b.URL(), "opaque", []string{"in/#"}))
	raw, _ := mustFrame(t, frameEvents(), frame.None)
	harness.Publish(t, b.URL(), "in/x", [][]byte{raw})
	batch, ack := ti.readBatch()
	if len(batch) != 1 || body(batch[0]) != string(raw) || batch[0].GetError() != nil {
		t.Fatalf("envelope: none: %d messages, body unchanged %v, error %v", len(batch), body(batch[0]) == string(raw), batch[0].GetError())
	}
	if _, ok := batch[0].MetaGet(metaEventID); ok {
		t.Fatal("envelope: none gave a frame an event_id")
	}
	_ = ack(context.Background(), nil)
}

// With envelope: properties (MQTT 5) a frame is read by its magic too:
// each event's message carries its own user properties only, not those of
// the PUBLISH that carried the frame; one ACK names the frame.
func TestFrameOverMQTT5WithThePropertiesEnvelope(t *testing.T) {
	b := startBroker(t)
	acks := harness.Subscribe(t, b.URL(), "ack-watcher", true, "acks/t")
	ti := openInput(t, inputYAML(b.URL(), "v5frames", []string{"in/#"}, `protocol_version: "5"`, "envelope: properties", "ack_topic: acks/t"))
	raw, id := mustFrame(t, frameEvents(), frame.Zstd)
	publishV5(t, b.URL(), "in/x", raw, &mqttmsg.Properties{User: []mqttmsg.UserProperty{{Key: "event_id", Value: id}, {Key: "outer", Value: "1"}}})
	batch, ack := ti.readBatch()
	if len(batch) != 3 {
		t.Fatalf("batch of %d messages, want 3", len(batch))
	}
	for k, e := range frameEvents() {
		if meta(batch[k], metaEventID) != e.ID || meta(batch[k], metaDestTopic) != e.Topic || body(batch[k]) != string(e.Payload) {
			t.Errorf("message %d: event_id %q destination_topic %q body %q", k, meta(batch[k], metaEventID), meta(batch[k], metaDestTopic), body(batch[k]))
		}
		if _, ok := batch[k].MetaGet("mqtt_user_property_outer"); ok {
			t.Errorf("message %d carries the PUBLISH's user property", k)
		}
	}
	if meta(batch[0], "mqtt_user_property_unit") != "C" {
		t.Errorf("event 1's own user property unit = %q", meta(batch[0], "mqtt_user_property_unit"))
	}
	ackExpectFirstACK(t, ack, acks, id)
}
