package mqttclient_test

import (
	"fmt"
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
// publishes to a client in the same table as the client's, and answers a
// SUBSCRIBE whose packet ID one of them holds with SUBACK 0x91 (packet
// identifier in use), to MQTT 5 and 3.1.1 clients alike. A resumed
// session whose unacknowledged message is in flight as packet ID 1 meets
// that on its first SUBSCRIBE (a new connection numbers from 1). The
// client subscribes again under the next packet ID and says so in the
// log: the connection becomes ready, the message is redelivered, and a
// filter the first session did not have is in place. Before, MQTT 5
// dropped the connection at every attempt (the consumer never came back)
// and 3.1.1 took 0x91 for success (the added filter got nothing).
func TestSubscribeRetriesWhenTheBrokerSaysThePacketIDIsInUse(t *testing.T) {
	eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
		url := "embedded://?dir=" + filepath.Join(t.TempDir(), "broker")
		withID := func(id string) mqttclient.Config { c := config(url); c.ClientID = id; return c }
		// The publisher keeps the in-process broker running between the
		// consumer's connections.
		pub := waitReady(t, startWith(t, withID("inuse-pub"), nil, nil, mqttclient.Options{}))
		got := newInbox()
		first := startWith(t, withID("inuse"), map[string]byte{"inuse": 1}, got, mqttclient.Options{ManualAck: true})
		waitReady(t, first)
		publish(t, pub, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "inuse", Payload: []byte("held")}, QoS: 1})
		if msg := got.waitFor(t, 1, 10*time.Second)[0]; msg.MessageID() != 1 {
			t.Fatalf("the broker sent the first message as packet ID %d: the test needs ID 1 in flight", msg.MessageID())
		}
		closeClient(t, first) // unacknowledged: it stays in flight in the session

		logs := &harness.LogBuffer{}
		log := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
		again := newInbox()
		filters := map[string]byte{"inuse": 1, "added": 1}
		second := startWith(t, withID("inuse"), filters, again, mqttclient.Options{ManualAck: true, Logger: log})
		conn := waitReady(t, second)
		if !conn.SessionPresent() {
			t.Fatal("session not present on the second connection")
		}
		if !logs.Contains("SUBACK 0x91 (packet identifier in use") {
			t.Fatalf("the resumed SUBSCRIBE met no 0x91, or the retry was not logged; logged:\n%s", logs)
		}
		if msg := again.waitFor(t, 1, 10*time.Second)[0]; string(msg.Payload()) != "held" {
			t.Fatalf("the resumed session redelivered %q, want \"held\"", msg.Payload())
		}
		publish(t, pub, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "added", Payload: []byte("new")}, QoS: 1})
		if msg := again.waitFor(t, 2, 10*time.Second)[1]; string(msg.Payload()) != "new" {
			t.Fatalf("after the resumed SUBSCRIBE %q arrived, want \"new\" on the added filter", msg.Payload())
		}
	})
}

// A resumed session whose broker holds more in-flight deliveries than the
// client will try packet IDs for (here 40 unacknowledged, against 32
// attempts): each refused SUBSCRIBE costs a round trip, and on a slow link
// they outlasted connect_timeout, after which the next connection
// numbered from 1 again, for ever (the embedded broker after a power cut,
// tests/powerloss path E). The connection goes on with a warning and the
// session's own subscription, which redelivers every held message.
func TestSubscribeGoesOnWithTheSessionAfterManyPacketIDsInUse(t *testing.T) {
	eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
		const held = 40
		url := "embedded://?dir=" + filepath.Join(t.TempDir(), "broker")
		withID := func(id string) mqttclient.Config { c := config(url); c.ClientID = id; return c }
		pub := waitReady(t, startWith(t, withID("inuse-many-pub"), nil, nil, mqttclient.Options{}))
		got := newInbox()
		first := startWith(t, withID("inuse-many"), map[string]byte{"inuse": 1}, got, mqttclient.Options{ManualAck: true})
		waitReady(t, first)
		for i := 0; i < held; i++ {
			publish(t, pub, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "inuse", Payload: []byte(fmt.Sprint(i))}, QoS: 1})
		}
		got.waitFor(t, held, 10*time.Second)
		closeClient(t, first) // all unacknowledged: IDs 1 … 40 stay in flight

		logs := &harness.LogBuffer{}
		log := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
		again := newInbox()
		second := startWith(t, withID("inuse-many"), map[string]byte{"inuse": 1}, again, mqttclient.Options{ManualAck: true, Logger: log})
		if conn := waitReady(t, second); !conn.SessionPresent() {
			t.Fatal("session not present on the second connection")
		}
		if !logs.Contains("going on with the subscriptions the resumed session already has") {
			t.Fatalf("no warning after the attempts ran out; logged:\n%s", logs)
		}
		if msgs := again.waitFor(t, held, 10*time.Second); len(msgs) < held {
			t.Fatalf("the resumed session redelivered %d of %d held messages", len(msgs), held)
		}
	})
}
