package mqttclient_test

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// The embedded broker (mochi) keeps the packet IDs of its own in-flight
// publishes to a client in the same table as the client's, and refuses a
// SUBSCRIBE whose packet ID one of them holds with SUBACK 0x91 (packet
// identifier in use). A resumed session whose unacknowledged message is
// in flight as packet ID 1 meets that on its first SUBSCRIBE (a fresh
// connection numbers from 1). The client subscribes again with the next
// packet ID, says so in the log, and the connection becomes ready; the
// message is redelivered and a new one arrives through the subscription.
// Before the retry the refusal dropped the connection at every attempt,
// and the consumer never came back.
func TestV5SubscribeRetriesWhenTheBrokerSaysThePacketIDIsInUse(t *testing.T) {
	url := "embedded://?dir=" + filepath.Join(t.TempDir(), "broker")
	// The publisher keeps the in-process broker running between the
	// consumer's connections.
	pub := waitReady(t, startWith(t, v5config("v5-inuse-pub", url), nil, nil, mqttclient.Options{}))
	cfg := v5config("v5-inuse", url)
	got := newInbox()
	first := startWith(t, cfg, map[string]byte{"inuse": 1}, got, mqttclient.Options{ManualAck: true})
	waitReady(t, first)
	publish(t, pub, mqttmsg.Publication{Topic: "inuse", QoS: 1, Payload: []byte("held")})
	if msg := got.waitFor(t, 1, 10*time.Second)[0]; msg.MessageID() != 1 {
		t.Fatalf("the broker sent the first message as packet ID %d: the test needs ID 1 in flight", msg.MessageID())
	}
	closeClient(t, first) // unacknowledged: it stays in flight in the session

	logs := &harness.LogBuffer{}
	log := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	again := newInbox()
	second := startWith(t, cfg, map[string]byte{"inuse": 1}, again, mqttclient.Options{ManualAck: true, Logger: log})
	conn := waitReady(t, second)
	if !conn.SessionPresent() {
		t.Fatal("session not present on the second connection")
	}
	if !logs.Contains("packet identifier in use") {
		t.Fatalf("the resumed SUBSCRIBE met no 0x91, or the retry was not logged; logged:\n%s", logs)
	}
	if msg := again.waitFor(t, 1, 10*time.Second)[0]; string(msg.Payload()) != "held" {
		t.Fatalf("the resumed session redelivered %q, want \"held\"", msg.Payload())
	}
	publish(t, pub, mqttmsg.Publication{Topic: "inuse", QoS: 1, Payload: []byte("new")})
	if msg := again.waitFor(t, 2, 10*time.Second)[1]; string(msg.Payload()) != "new" {
		t.Fatalf("after the resumed SUBSCRIBE %q arrived, want \"new\"", msg.Payload())
	}
}
