package mqttout

import (
	"fmt"
	"strconv"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/properties"
)

// record is a message in the form it is published: what the outbox stores
// and what the sender sends, so that a resend is byte-identical.
type record struct {
	eventID string
	topic   string // the publish topic: data_topic for end_to_end
	payload []byte // the publish payload, enveloped if configured
	retain  bool   // direct mode: the message's retain flag
	props   *mqttclient.Properties
}

// storedTopic is the record's topic field in the outbox: the topic, and
// its MQTT 5 properties if any.
func (r record) storedTopic() string { return properties.StoreTopic(r.topic, r.props) }

// buildRecord resolves topic and event ID and encodes the payload. Every
// rejection happens here, before anything is stored, with an error that
// names the message; each is permanent (see PermanentPrefix): the same
// message fails the same way every time.
func (o *output) buildRecord(msg *service.Message) (record, error) {
	rec, err := o.encode(msg)
	if err != nil {
		return record{}, permanent(err)
	}
	return rec, nil
}

func (o *output) encode(msg *service.Message) (record, error) {
	topic, err := o.s.topic.TryString(msg)
	if err != nil {
		return record{}, fmt.Errorf("topic interpolation failed: %w", err)
	}
	if err := envelope.CheckPublishTopic(topic); err != nil {
		return record{}, fmt.Errorf("invalid destination topic %q: %w", topic, err)
	}
	id, err := o.s.eventID.TryString(msg)
	if err != nil {
		return record{}, fmt.Errorf("event_id interpolation failed: %w", err)
	}
	switch {
	case id == "null":
		// What a missing metadata key interpolates to: publishing it would
		// give every such message the same event ID.
		return record{}, fmt.Errorf("event_id evaluated to \"null\" for topic %q: the metadata or field it names is missing; nothing is published. Write ${! meta(\"event_id\").or(\"\") } to fall back to a generated ID", topic)
	case id == "":
		id = envelope.NewEventID()
	default:
		if err := envelope.CheckEventID(id); err != nil {
			return record{}, err
		}
	}
	raw, err := msg.AsBytes()
	if err != nil {
		return record{}, fmt.Errorf("event %s: reading payload: %w", id, err)
	}

	rec := record{eventID: id, topic: topic, payload: raw}
	if rec.props, err = o.s.v5.props(msg); err != nil {
		return record{}, fmt.Errorf("event %s for topic %q: %w", id, topic, err)
	}
	switch {
	case o.s.propertiesEnv && o.s.endToEnd:
		rec.topic = o.s.dataTopic
		rec.props = properties.Stamp(rec.props, id, topic)
	case o.s.propertiesEnv:
		rec.props = properties.Stamp(rec.props, id, "")
	case o.s.endToEnd:
		rec.topic = o.s.dataTopic
		rec.payload, err = envelope.EncodeIngress(id, topic, raw)
	case o.s.deliveryEnv:
		rec.payload, err = envelope.EncodeDelivery(id, raw)
	}
	if err != nil {
		return record{}, fmt.Errorf("event %s for topic %q cannot be enveloped (the payload must be strict JSON; use envelope: none with confirm: broker for other bytes): %w", id, topic, err)
	}
	rec.retain = o.s.retainedConst
	if o.s.retained != nil {
		v, err := o.s.retained.TryString(msg)
		if err != nil {
			return record{}, fmt.Errorf("event %s: retained interpolation failed: %w", id, err)
		}
		if rec.retain, err = strconv.ParseBool(v); err != nil {
			return record{}, fmt.Errorf("event %s: retained evaluated to %q, want true or false", id, v)
		}
	}
	if len(rec.payload) > o.s.maxPayloadBytes {
		return record{}, fmt.Errorf("event %s for topic %q: payload of %d bytes exceeds max_payload_bytes (%d)", id, topic, len(rec.payload), o.s.maxPayloadBytes)
	}
	return rec, nil
}
