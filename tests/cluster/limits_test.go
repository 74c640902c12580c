package cluster

import (
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// checkProtocolLimits shows two limits of RabbitMQ 3.10's MQTT plugin that
// docs/scaling.md states: a QoS 2 subscription is granted QoS 1, and a
// $share/<group>/<filter> subscription is accepted but receives nothing
// (no shared subscriptions: consumer groups need another broker).
func checkProtocolLimits(t *testing.T, url string) {
	t.Helper()
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID("cl-probe-qos2").
		SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("probe connect to %s: %v", url, tok.Error())
	}
	defer c.Disconnect(100)
	tok := c.Subscribe("cl/probe/qos2", 2, nil)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("probe subscribe at QoS 2: %v", tok.Error())
	}
	granted := tok.(*mqtt.SubscribeToken).Result()["cl/probe/qos2"]
	t.Logf("RabbitMQ granted QoS %d to a QoS 2 subscription", granted)
	if granted != 1 {
		t.Errorf("a QoS 2 subscription was granted QoS %d; docs/scaling.md says RabbitMQ 3.10 grants 1", granted)
	}

	shared := harness.Subscribe(t, url, "cl-probe-shared", true, "$share/g/cl/probe/shared")
	plain := harness.Subscribe(t, url, "cl-probe-plain", true, "cl/probe/shared")
	harness.Publish(t, url, "cl/probe/shared", harness.Payloads("x"))
	if !plain.WaitCount(1, 10*time.Second) {
		t.Fatal("a plain subscriber did not get the probe message: the probe proves nothing")
	}
	time.Sleep(time.Second) // the shared subscriber had as long as the plain one, and more
	t.Logf("$share subscriber received %d of 1 message", shared.Count())
	if shared.Count() != 0 {
		t.Errorf("a $share subscription received %d messages; docs/scaling.md says RabbitMQ 3.10 has no shared subscriptions", shared.Count())
	}
	shared.Close()
	plain.Close()
}
