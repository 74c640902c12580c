package mqttout

import (
	"errors"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sender"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/conffield"
)

func packField() *service.ConfigField {
	return service.NewObjectField(fieldPack,
		service.NewIntField(fieldPackMaxEvents).
			Description("The most consecutive outbox records one PUBLISH carries, as a frame (docs/frames.md). `1` sends every record alone, as reliomq v1 peers and plain subscribers read it. A frame takes what is waiting when there is room in the window; it never waits to fill, so at low rates records still go one by one.").
			Default(1),
		service.NewIntField(fieldPackMaxBytes).
			Description("The most bytes of events (before compression) a frame carries, and never more than `max_payload_bytes`; a record larger than that goes alone.").
			Default(sender.DefaultPackMaxBytes),
		service.NewStringEnumField(fieldPackCompression, frame.None, frame.Zstd).
			Description("How a frame's events are compressed (the receiver reads both without a setting).").
			Default(frame.Zstd),
	).Description("Pack consecutive records into frames: one PUBLISH, one slot of the broker's Receive Maximum and one confirmation (the frame's ACK with `confirm: end_to_end`, its PUBACK with `confirm: broker`) for many events, each keeping its event ID, destination topic, user properties and trace context. A record leaves the outbox only when its frame is confirmed; `window` still counts records. In direct mode (no outbox) the messages of one batch travel as frames, and each message's write succeeds only when its frame is confirmed: a bridge whose input batch came from one frame forwards it as frames and acknowledges its source after every event was confirmed downstream. The receiver must read frames: a `reliable_mqtt_in` with an envelope (`envelope: ingress`, `delivery` or `properties`). Needs an envelope (with `confirm: broker`: `envelope: delivery` or `properties`), no `content_type` or `message_expiry` (a frame carries user properties only), and `retained: false`.").
		Advanced()
}

// parsePack reads pack; its bytes never exceed max_payload_bytes.
func parsePack(conf *service.ParsedConfig, maxPayloadBytes int) (p sender.Pack, err error) {
	if p.MaxEvents, err = conffield.FieldIntIn(conf, 1, frame.MaxEvents, fieldPack, fieldPackMaxEvents); err != nil {
		return p, err
	}
	if p.MaxBytes, err = conffield.FieldIntIn(conf, 1, frame.MaxDecodedBytes, fieldPack, fieldPackMaxBytes); err != nil {
		return p, err
	}
	p.MaxBytes = min(p.MaxBytes, maxPayloadBytes)
	p.Compression, err = conffield.FieldEnum(conf.Namespace(fieldPack), fieldPackCompression, frame.None, frame.Zstd)
	return p, err
}

// checkPackable refuses pack where the receiver could not read frames or
// a frame could not carry what each record carries (the lint rule says the
// same). retainedVaries is an interpolated retained (direct mode).
func checkPackable(o *sender.Options, v5 v5Fields, retainedVaries bool) error {
	switch {
	case !o.Encoding.Packable():
		return errors.New("pack: with confirm: broker and envelope: none any subscriber reads the topic, and a plain subscriber cannot read frames; use envelope: delivery or properties, or confirm: end_to_end")
	case v5.contentType != nil || v5.messageExpiry != nil:
		return errors.New("pack: a frame carries user properties only; content_type and message_expiry need pack.max_events: 1")
	case o.Retained || retainedVaries:
		return errors.New("pack: a retained frame would keep several events as the topic's one retained message; set retained: false or pack.max_events: 1")
	}
	return nil
}
