package mqttin

import (
	"context"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// publishRetained publishes one retained message at QoS 1.
func publishRetained(t *testing.T, url, topic, payload string) {
	t.Helper()
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID("retainer").SetConnectTimeout(5 * time.Second))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(100)
	if tok := c.Publish(topic, 1, true, payload); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish retained: %v", tok.Error())
	}
}

// An envelope that arrives retained is delivered again at every
// subscription, so at every reconnect and restart: the input says so. An
// ordinary envelope does not warn.
func TestRetainedEnvelopeIsWarnedAbout(t *testing.T) {
	b := startBroker(t)
	topics := []string{"ingress/#"}
	publishRetained(t, b.URL(), "ingress/r", mustIngress(t, "ev-retained", "dest/r", `{"n":1}`))
	ti := openInput(t, inputYAML(b.URL(), "retained-warn", topics, "envelope: ingress"))
	publish(t, b.URL(), "ingress/p", mustIngress(t, "ev-plain", "dest/p", `{"n":2}`))

	for range 2 {
		msg, ack := ti.read()
		id, _ := msg.MetaGet(metaEventID)
		warned := strings.Contains(ti.logs.String(), "Envelope of event "+id+" on ")
		if want := id == "ev-retained"; warned != want {
			t.Fatalf("event %s: warned %v, want %v; log:\n%s", id, warned, want, ti.logs.String())
		}
		_ = ack(context.Background(), nil)
	}
	if !strings.Contains(ti.logs.String(), "arrived retained") || !strings.Contains(ti.logs.String(), "mosquitto_pub -r -n -t 'ingress/r'") {
		t.Fatalf("the warning does not name the topic and the fix:\n%s", ti.logs.String())
	}
}
