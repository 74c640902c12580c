package mqttclient_test

import (
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// TestFailsOverPastABrokerThatAcceptsButNeverAnswers: the first of two
// URLs accepts TCP and then says nothing (a hung cluster node). Each URL
// gets its own connect_timeout, so the client reaches the second one; a
// budget of one connect_timeout for the whole list would spend every
// attempt on the first URL and never connect.
func TestFailsOverPastABrokerThatAcceptsButNeverAnswers(t *testing.T) {
	eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{})
		hung := harness.NewProxy(t, m.Addr())
		hung.Stall()
		c, err := mqttclient.Start(config(hung.URL(), m.URL()), mqttclient.Handlers{}, mqttclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer closeClient(t, c)
		waitReady(t, c)
		if hung.Conns() == 0 {
			t.Fatal("the hung URL was never tried: the test did not exercise failover")
		}
	})
}
