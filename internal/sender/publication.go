package sender

import (
	"errors"
	"fmt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/internal/properties"
)

// failedToken is a publish refused before it was sent.
type failedToken struct{ err error }

func (failedToken) Done() <-chan struct{} { return closedChan }
func (t failedToken) Error() error        { return t.err }

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// checkLimits refuses a connection on which no record can be published the
// way the output is configured: every record goes out at QoS 1.
func checkLimits(l mqttclient.ServerLimits, retained bool) error {
	if l.MaximumQoS < 1 {
		return errors.New("the server's CONNACK allows QoS 0 only (Maximum QoS 0), and records are published at QoS 1, the lowest level with a confirmation: raise the broker's maximum QoS")
	}
	if retained && !l.RetainAvailable {
		return errors.New("the server's CONNACK says it does not accept retained messages (Retain Available 0): set retained: false or allow retained messages at the broker")
	}
	return nil
}

// recordPublication is the publish of an outbox record: its topic field
// may carry MQTT 5 properties (see properties.StoreTopic).
func recordPublication(r outbox.Record, c Config, l mqttclient.ServerLimits) (mqttclient.Publication, error) {
	topic, props, err := properties.LoadTopic(r.Topic)
	if err != nil {
		return mqttclient.Publication{}, err
	}
	return publication(Message{Topic: topic, Payload: r.Payload, Retain: c.Retained, Props: props}, c, l)
}

// publication is the QoS 1 publish of m, refused when it exceeds the
// server's Maximum Packet Size (a broker disconnects a client that sends a
// larger packet, which would look like an endless outage).
func publication(m Message, c Config, l mqttclient.ServerLimits) (mqttclient.Publication, error) {
	p := mqttclient.Publication{Topic: m.Topic, QoS: 1, Retained: m.Retain, Payload: m.Payload,
		Props: m.Props, RequireSubscribers: c.RequireSubscribers}
	if max := l.MaximumPacketSize; max > 0 {
		if n := packetSizeBound(p); n > uint64(max) {
			return p, fmt.Errorf("a PUBLISH of up to %d bytes to %q exceeds the server's Maximum Packet Size of %d bytes: the record stays in the outbox until the broker allows it (or it is purged)", n, m.Topic, max)
		}
	}
	return p, nil
}

// packetSizeBound is an upper bound of p's size on the wire: the largest
// variable-length integers, two-byte string lengths, one byte per property
// identifier.
func packetSizeBound(p mqttclient.Publication) uint64 {
	n := 1 + 4 + 2 + len(p.Topic) + 2 + len(p.Payload)
	if pp := p.Props; pp != nil {
		n += 4
		for _, u := range pp.User {
			n += 1 + 2 + len(u.Key) + 2 + len(u.Value)
		}
		n += 3 + len(pp.ContentType) + 3 + len(pp.ResponseTopic) + 3 + len(pp.CorrelationData) + 5
	}
	return uint64(n)
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

// plainTopic is the publish topic of a record's topic field.
func plainTopic(stored string) string {
	topic, _, _ := properties.LoadTopic(stored)
	return topic
}
