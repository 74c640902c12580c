package mqttout_test

import (
	"path/filepath"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// A retained message on the ACK topic comes back at every subscription:
// the output warns, naming the topic and how to clear it.
func TestRetainedACKIsWarnedAbout(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(m.URL()).SetClientID("retainer").SetConnectTimeout(5 * time.Second))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	if tok := c.Publish("e2e/acks", 1, true, `{"event_id":"stale","version":1}`); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish retained: %v", tok.Error())
	}
	c.Disconnect(100)

	p := streamtest.Start(t, outputConf(m.URL(), filepath.Join(t.TempDir(), "outbox.db"), "confirm", "end_to_end", "data_topic", "e2e/data", "ack_topic", "e2e/acks"))
	harness.Eventually(t, 30*time.Second, "a warning about the retained ACK", func() bool {
		return p.Logs.Contains("A retained message arrived on the ACK topic") && p.Logs.Contains("mosquitto_pub -r -n -t 'e2e/acks'")
	})
}
