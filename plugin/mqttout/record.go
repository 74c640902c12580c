package mqttout

import (
	"fmt"
	"strconv"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// buildRecord evaluates the message's interpolations and encodes it as the
// record the outbox stores and the sender sends. Every rejection happens
// here, before anything is stored, with an error that names the message;
// each is permanent (see PermanentPrefix): the same message fails the same
// way every time.
func (o *output) buildRecord(msg *service.Message) (mqttmsg.Event, error) {
	rec, err := o.encode(msg)
	if err != nil {
		return mqttmsg.Event{}, codec.Permanent(err)
	}
	return rec, nil
}

func (o *output) encode(msg *service.Message) (rec mqttmsg.Event, err error) {
	topic, err := o.s.topic.TryString(msg)
	if err != nil {
		return rec, fmt.Errorf("topic interpolation failed: %w", err)
	}
	if err := codec.CheckTopic(topic); err != nil {
		return rec, err
	}
	id, err := o.s.eventID.TryString(msg)
	if err != nil {
		return rec, fmt.Errorf("event_id interpolation failed: %w", err)
	}
	if id, err = codec.EventID(id, topic); err != nil {
		return rec, err
	}
	raw, err := msg.AsBytes()
	if err != nil {
		return rec, fmt.Errorf("event %s: reading payload: %w", id, err)
	}
	props, err := o.s.v5.props(msg)
	if err != nil {
		return rec, fmt.Errorf("event %s for topic %q: %w", id, topic, err)
	}
	retained := o.s.retainedConst
	if o.s.retained != nil {
		v, err := o.s.retained.TryString(msg)
		if err != nil {
			return rec, fmt.Errorf("event %s: retained interpolation failed: %w", id, err)
		}
		if retained, err = strconv.ParseBool(v); err != nil {
			return rec, fmt.Errorf("event %s: retained evaluated to %q, want true or false", id, v)
		}
	}
	return o.out.Encode(id, topic, raw, props, retained)
}
