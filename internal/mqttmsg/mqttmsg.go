// Package mqttmsg is what an MQTT PUBLISH carries, as every reliable-mqtt
// package sees it: the Event an output sends, the Publication that carries
// it, the Message a component receives and the MQTT 5 Properties of either. It is a leaf: it imports no MQTT client
// and no Benthos, so the engines, the codec and the properties rules can
// name a publish without linking either.
package mqttmsg

import "time"

// Event is one outgoing event, the one type from the output's plugin to the
// wire: the output builds and encodes it once, the outbox stores it as a
// record (outbox.Record) and the sender publishes it as it is, so a resend
// is byte-identical.
type Event struct {
	EventID string // empty for a publish that names no event (an ACK)
	Topic   string
	Payload []byte
	// Props are MQTT 5 properties. A 3.1.1 connection refuses a
	// Publication that carries any (mqttclient.ErrNeedsV5): dropping them
	// silently would lose an event ID sent as a user property.
	Props    *Properties
	Retained bool
}

// Publication is one outgoing PUBLISH: an event and how it is sent.
type Publication struct {
	Event
	QoS byte
	// RequireSubscribers turns an MQTT 5 PUBACK with reason code 0x10 (no
	// matching subscribers) into a *mqttclient.ReasonCodeError; otherwise
	// 0x10 is a success, as the protocol says. Meaningless on 3.1.1.
	RequireSubscribers bool
}

// Message is one received PUBLISH, as the components see it: they never
// name the MQTT library (mqttclient implements it; the inbox takes it).
// Ack sends its PUBACK (QoS 1) or PUBREC (QoS 2); with
// mqttclient.Options.ManualAck nothing is acknowledged until it is called.
type Message interface {
	Topic() string
	Qos() byte
	MessageID() uint16
	Duplicate() bool
	Retained() bool
	Payload() []byte
	// Properties are the MQTT 5 PUBLISH properties; nil on 3.1.1.
	Properties() *Properties
	Ack()
}

// Properties are the MQTT 5 PUBLISH properties the components use. A
// 3.1.1 message has none (nil).
type Properties struct {
	// User are the user properties in wire order; a key may repeat.
	User            []UserProperty
	ContentType     string
	ResponseTopic   string
	CorrelationData []byte
	// MessageExpiry is the message expiry interval, whole seconds on the
	// wire; 0 means the message does not expire.
	MessageExpiry time.Duration
}

// UserProperty is one MQTT 5 user property.
type UserProperty struct{ Key, Value string }

// Get returns the value of the first user property named key.
func (p *Properties) Get(key string) (string, bool) {
	if p == nil {
		return "", false
	}
	for _, u := range p.User {
		if u.Key == key {
			return u.Value, true
		}
	}
	return "", false
}
