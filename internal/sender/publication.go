package sender

import (
	"errors"
	"fmt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// publication is the QoS 1 publish of ev. The transport refuses what the
// server's CONNACK does not allow (Maximum QoS, Retain Available, Maximum
// Packet Size) before sending it, and the record stays.
func publication(ev mqttmsg.Event, c Config) mqttmsg.Publication {
	return mqttmsg.Publication{Event: ev, QoS: 1, RequireSubscribers: c.RequireSubscribers}
}

// publishFailed counts an MQTT 5 reason code that failed a publish; the
// error names the event, the topic and the code.
func publishFailed(m Metrics, eventID, topic string, err error) error {
	var rc *mqttclient.ReasonCodeError
	if !errors.As(err, &rc) {
		return fmt.Errorf("publishing event %s to %q failed: %w", eventID, topic, err)
	}
	m.OnReasonCode(rc.Code)
	if rc.Code == mqttclient.ReasonNoMatchingSubscribers {
		return fmt.Errorf("event %s: no subscriber matches topic %q (PUBACK 0x10, require_subscribers: true)", eventID, topic)
	}
	return fmt.Errorf("event %s: the broker refused the publish to %q (%w)", eventID, topic, err)
}
