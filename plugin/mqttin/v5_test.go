package mqttin

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
	"github.com/reliable-mqtt/reliable-mqtt/internal/embedded"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// parseInput parses and builds an input without connecting it.
func parseInput(t *testing.T, yaml string) (*input, error) {
	t.Helper()
	conf, err := inputSpec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	return newInput(conf, service.MockResources())
}

// envelope: properties is refused on 3.1.1, at start, naming the fix.
func TestPropertiesEnvelopeNeedsMQTT5(t *testing.T) {
	_, err := parseInput(t, inputYAML("tcp://127.0.0.1:1", "c", []string{"a/#"}, "envelope: properties"))
	if err == nil || !strings.Contains(err.Error(), `protocol_version: "5"`) {
		t.Fatalf("envelope: properties on 3.1.1: %v, want an error naming protocol_version", err)
	}
	if _, err := parseInput(t, inputYAML("tcp://127.0.0.1:1", "c", []string{"a/#"}, "envelope: ingress")); err != nil {
		t.Fatalf("envelope: ingress on 3.1.1: %v", err)
	}
}

// The Receive Maximum sent in CONNECT is receive_buffer_size, capped at
// the protocol's 65535.
func TestReceiveMaximumIsTheReceiveBufferCapped(t *testing.T) {
	for size, want := range map[string]uint16{"20": 20, "1000": 1000, "65535": 65535, "100000": 65535} {
		in, err := parseInput(t, inputYAML("tcp://127.0.0.1:1", "c", []string{"a/#"}, "receive_buffer_size: "+size))
		if err != nil {
			t.Fatal(err)
		}
		if got := in.s.client.ReceiveMaximum; got != want {
			t.Errorf("receive_buffer_size %s: Receive Maximum %d, want %d", size, got, want)
		}
	}
}

// publishV5 publishes one message with MQTT 5 properties through the
// transport the components use, and waits for its PUBACK.
func publishV5(t *testing.T, url, topic string, payload []byte, props *mqttmsg.Properties) {
	t.Helper()
	tr, err := embedded.StartClient(mqttclient.Config{
		URLs: []string{url}, ClientID: "v5-test-publisher", CleanSession: true, ProtocolVersion: mqttclient.V5,
		KeepAlive: 30 * time.Second, ConnectTimeout: 5 * time.Second,
		Reconnect: backoff.Backoff{Initial: 50 * time.Millisecond, Max: time.Second},
	}, mqttclient.Handlers{}, mqttclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	defer tr.Close(ctx)
	conn, err := tr.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Publish(ctx, mqttmsg.Publication{Event: mqttmsg.Event{Topic: topic, Payload: payload, Props: props}, QoS: 1}); err != nil {
		t.Fatal(err)
	}
}

// With envelope: properties the event ID and destination come from user
// properties and the payload is the body, byte for byte; the end-to-end
// ACK is the reliomq v1 ACK. A message without an event_id property (here
// one published over 3.1.1, which has none) is malformed: with
// on_malformed: flag it reaches the pipeline flagged, unchanged, without
// event_id, and gets no ACK. Every property shows as metadata.
func TestPropertiesEnvelopeDecodedAndAckedEndToEnd(t *testing.T) {
	b := startBroker(t)
	acks := harness.Subscribe(t, b.URL(), "ack-watcher", true, "acks/t")
	ti := openInput(t, inputYAML(b.URL(), "props", []string{"in/#"},
		`protocol_version: "5"`, "envelope: properties", "ack_topic: acks/t", "on_malformed: flag"))

	payload := []byte{0xff, 0x00, 0xfe, 'x'}
	publishV5(t, b.URL(), "in/a", payload, &mqttmsg.Properties{
		User:          []mqttmsg.UserProperty{{Key: "event_id", Value: "ev-1"}, {Key: "destination_topic", Value: "dest/x"}, {Key: "k", Value: "1"}, {Key: "k", Value: "2"}},
		ContentType:   "application/octet-stream",
		ResponseTopic: "reply/here", CorrelationData: []byte{1, 2}, MessageExpiry: time.Hour,
	})
	msg, ack := ti.read()
	if err := msg.GetError(); err != nil {
		t.Fatalf("valid message flagged: %v", err)
	}
	if got := body(msg); got != string(payload) {
		t.Fatalf("body %x, want %x unchanged", got, payload)
	}
	for k, want := range map[string]string{
		metaEventID: "ev-1", metaDestTopic: "dest/x", "mqtt_content_type": "application/octet-stream",
		"mqtt_response_topic": "reply/here", "mqtt_correlation_data": "\x01\x02", "mqtt_user_property_event_id": "ev-1",
	} {
		if got := meta(msg, k); got != want {
			t.Errorf("metadata %s = %q, want %q", k, got, want)
		}
	}
	if v, ok := msg.MetaGetMut("mqtt_user_property_k"); !ok || fmt.Sprint(v) != "[1 2]" {
		t.Errorf("a repeated user property: %#v, want the list [1 2]", v)
	}
	if got := meta(msg, "mqtt_message_expiry"); got != "3600s" && got != "3599s" {
		t.Errorf("mqtt_message_expiry = %q, want about 3600s", got)
	}
	ackExpectFirstACK(t, ack, acks, "ev-1")

	publish(t, b.URL(), "in/b", "no properties")
	msg, ack = ti.read()
	if msg.GetError() == nil || body(msg) != "no properties" {
		t.Fatalf("a message without event_id: error %v, body %q; want flagged and unchanged", msg.GetError(), body(msg))
	}
	if _, ok := msg.MetaGet(metaEventID); ok {
		t.Fatal("a malformed message carries event_id")
	}
	_ = ack(context.Background(), nil)
	time.Sleep(300 * time.Millisecond) // an ACK for it would arrive by now
	if n := acks.Count(); n != 1 {
		t.Fatalf("%d ACKs published, want 1", n)
	}
}
