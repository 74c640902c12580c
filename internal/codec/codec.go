// Package codec is how an event rides on MQTT, in both directions and
// without Benthos: the reliomq v1 envelopes (internal/envelope) or, on
// MQTT 5, user properties (internal/properties). The output encodes a
// message into the record it stores and publishes; the input decodes a
// received payload into body, event ID and destination topic.
package codec

import (
	"fmt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/properties"
)

// The envelope modes, as the plugins' `envelope` field names them.
const (
	None       = "none"       // the payload as it is, no event ID
	Ingress    = "ingress"    // reliomq v1 ingress envelope: event ID, destination topic, payload
	Delivery   = "delivery"   // reliomq v1 delivery envelope: event ID, payload
	Properties = "properties" // MQTT 5 user properties; the payload untouched
)

// Decoded is a received payload after envelope decoding.
type Decoded struct {
	Body      []byte
	EventID   string
	DestTopic string
	Err       error // a malformed envelope: Body is then the payload as received
}

// Decode reads payload, received on topic with the MQTT 5 properties props
// (nil on 3.1.1), as mode says. A malformed envelope is reported in Err,
// naming the topic and the defect.
func Decode(mode, topic string, payload []byte, props *mqttmsg.Properties) *Decoded {
	switch mode {
	case Ingress:
		ing, err := envelope.DecodeIngress(payload)
		if err != nil {
			return &Decoded{Body: payload, Err: fmt.Errorf("message on topic %q is not a valid reliomq v1 ingress envelope: %w", topic, err)}
		}
		return &Decoded{Body: ing.Payload, EventID: ing.EventID, DestTopic: ing.Topic}
	case Delivery:
		del, err := envelope.DecodeDelivery(payload)
		if err != nil {
			return &Decoded{Body: payload, Err: fmt.Errorf("message on topic %q is not a valid reliomq v1 delivery envelope: %w", topic, err)}
		}
		return &Decoded{Body: del.Payload, EventID: del.EventID}
	case Properties:
		env, err := properties.Read(props)
		if err != nil {
			return &Decoded{Body: payload, Err: fmt.Errorf("message on topic %q has no valid event ID in its MQTT 5 user properties: %w", topic, err)}
		}
		return &Decoded{Body: payload, EventID: env.EventID, DestTopic: env.DestTopic}
	default:
		return &Decoded{Body: payload}
	}
}

// AckPayload is the end-to-end ACK of eventID: signed with authKey, or a
// plain reliomq v1 ACK when authKey is nil.
func AckPayload(eventID string, authKey []byte) ([]byte, error) {
	if authKey != nil {
		return envelope.EncodeAuthAck(eventID, authKey)
	}
	return envelope.EncodeAck(eventID)
}

// CheckTopic refuses a destination topic no broker accepts for a PUBLISH.
func CheckTopic(topic string) error {
	if err := envelope.CheckPublishTopic(topic); err != nil {
		return fmt.Errorf("invalid destination topic %q: %w", topic, err)
	}
	return nil
}

// EventID is the event ID a message to topic is published under: id as
// given, or a new one when id is empty. "null" is refused: it is what a
// missing metadata key interpolates to, and publishing it would give every
// such message the same event ID.
func EventID(id, topic string) (string, error) {
	switch {
	case id == "null":
		return "", fmt.Errorf("event_id evaluated to \"null\" for topic %q: the metadata or field it names is missing; nothing is published. Write ${! meta(\"event_id\").or(\"\") } to fall back to a generated ID", topic)
	case id == "":
		return envelope.NewEventID(), nil
	default:
		if err := envelope.CheckEventID(id); err != nil {
			return "", err
		}
		return id, nil
	}
}

// Message is one event as the output publishes it: its record in the
// outbox, or one publish in direct mode.
type Message struct {
	EventID string
	Topic   string
	Payload []byte
	Retain  bool
	Props   *mqttmsg.Properties // MQTT 5 only
}

// Encoding is how the output turns a message into the record it stores and
// publishes, so that a resend is byte-identical.
type Encoding struct {
	Mode            string // None, Delivery or Properties
	EndToEnd        bool   // publish to DataTopic, carrying the destination topic
	DataTopic       string
	MaxPayloadBytes int
}

// Encode builds the record of event id for topic from the payload raw and
// the MQTT 5 properties extra (nil: none). It does not check the size (see
// CheckSize).
func (e Encoding) Encode(id, topic string, raw []byte, extra *mqttmsg.Properties) (Message, error) {
	rec := Message{EventID: id, Topic: topic, Payload: raw, Props: extra}
	var err error
	switch {
	case e.Mode == Properties && e.EndToEnd:
		rec.Topic = e.DataTopic
		rec.Props = properties.Stamp(extra, id, topic)
	case e.Mode == Properties:
		rec.Props = properties.Stamp(extra, id, "")
	case e.EndToEnd:
		rec.Topic = e.DataTopic
		rec.Payload, err = envelope.EncodeIngress(id, topic, raw)
	case e.Mode == Delivery:
		rec.Payload, err = envelope.EncodeDelivery(id, raw)
	}
	if err != nil {
		return Message{}, fmt.Errorf("event %s for topic %q cannot be enveloped (the payload must be strict JSON; use envelope: none with confirm: broker for other bytes): %w", id, topic, err)
	}
	return rec, nil
}

// CheckSize refuses a record whose payload exceeds MaxPayloadBytes; topic
// is the destination topic the message was written for.
func (e Encoding) CheckSize(rec Message, topic string) error {
	if len(rec.Payload) > e.MaxPayloadBytes {
		return fmt.Errorf("event %s for topic %q: payload of %d bytes exceeds max_payload_bytes (%d)", rec.EventID, topic, len(rec.Payload), e.MaxPayloadBytes)
	}
	return nil
}
