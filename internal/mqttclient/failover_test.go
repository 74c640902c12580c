package mqttclient_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// TestFailsOverPastABrokerThatAcceptsButNeverAnswers: the first of two
// URLs accepts TCP and then says nothing (a hung cluster node). Each URL
// gets its own connect_timeout, so the client reaches the second one; a
// budget of one connect_timeout for the whole list would spend every
// attempt on the first URL and never connect. The silent node costs one
// connect_timeout, not two: it is dialled once (paho, left to guess the
// protocol, would dial it again with MQTT 3.1). The log names the node
// reached.
func TestFailsOverPastABrokerThatAcceptsButNeverAnswers(t *testing.T) {
	eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{})
		hung := harness.NewProxy(t, m.Addr())
		hung.Stall()
		var logs harness.LogBuffer
		log := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
		c, err := mqttclient.Start(config(hung.URL(), m.URL()), mqttclient.Handlers{}, mqttclient.Options{Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		defer closeClient(t, c)
		waitReady(t, c)
		if n := hung.Conns(); n != 1 {
			t.Fatalf("the hung URL was dialled %d times before the client connected to the next one, want 1", n)
		}
		want := "MQTT connected to " + m.URL() + " (URL 2 of 2)"
		harness.Eventually(t, 5*time.Second, "the connected line naming the node", func() bool { return strings.Contains(logs.String(), want) })
	})
}
