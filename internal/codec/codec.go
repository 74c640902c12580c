// Package codec is how an event rides on MQTT, in both directions and
// without Benthos: the reliomq v1 envelopes (internal/envelope) or, on
// MQTT 5, user properties (internal/properties). The output encodes a
// message into the record it stores and publishes, and a stored record
// into the event a frame carries (pack.go); the input decodes a received
// payload into body, event ID and destination topic, or a frame's events.
// ACKs are encoded and read here too.
package codec

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
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
	EventID   string // for a frame: the frame's ID, which its ACK names
	DestTopic string
	Trace     envelope.TraceContext // from the envelope (Decoding.TraceContext); zero when none
	Err       error                 // a malformed envelope or frame: Body is then the payload as received
	// Events are a frame's events, in order (nil for anything else): each
	// becomes a message of its own. Body is then nil.
	Events []frame.Event
}

// TraceContextHint is what a receiver without the opt-in tells about an
// envelope that carries a trace context: the setting that accepts it.
const TraceContextHint = "the sender adds a trace context (trace_context: envelope): set trace_context: envelope on this reliable_mqtt_in too, or turn it off at the sender"

// Decoding is how the input reads a received payload.
type Decoding struct {
	Mode string // None, Ingress, Delivery or Properties
	// TraceContext accepts (and returns in Decoded.Trace) a W3C trace
	// context in the reliomq v1 envelopes; without it those keys are
	// refused, as reliomq v1 refuses every key it does not know.
	TraceContext bool
}

// Decode reads payload, received on topic with the MQTT 5 properties props
// (nil on 3.1.1), as d says. In every mode but None a payload that starts
// with the frame magic is a frame (internal/frame), whatever the mode's
// own form; with None every payload stays opaque, so nobody can smuggle
// several messages into a plain topic. A malformed envelope or frame is
// reported in Err, naming the topic and the defect; a frame is refused
// before it is expanded past frame.DefaultLimits.
func (d Decoding) Decode(topic string, payload []byte, props *mqttmsg.Properties) *Decoded {
	if d.Mode != None && d.Mode != "" && frame.Is(payload) {
		return decodeFrame(topic, payload, d.Mode == Ingress)
	}
	switch d.Mode {
	case Ingress:
		ing, err := traced(envelope.DecodeIngress, envelope.DecodeTracedIngress, d.TraceContext)(payload)
		if err != nil {
			return invalidEnvelope(topic, "ingress", payload, err)
		}
		return &Decoded{Body: ing.Payload, EventID: ing.EventID, DestTopic: ing.Topic, Trace: ing.Trace}
	case Delivery:
		del, err := traced(envelope.DecodeDelivery, envelope.DecodeTracedDelivery, d.TraceContext)(payload)
		if err != nil {
			return invalidEnvelope(topic, "delivery", payload, err)
		}
		return &Decoded{Body: del.Payload, EventID: del.EventID, Trace: del.Trace}
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

// traced picks an envelope's decoder: the one that accepts a trace context
// when on, else the strict reliomq v1 one.
func traced[T any](strict, withTrace func([]byte) (T, error), on bool) func([]byte) (T, error) {
	if on {
		return withTrace
	}
	return strict
}

// invalidEnvelope is the result of a payload that is not a valid envelope
// of kind.
func invalidEnvelope(topic, kind string, payload []byte, err error) *Decoded {
	return &Decoded{Body: payload, Err: fmt.Errorf("message on topic %q is not a valid reliomq v1 %s envelope: %w", topic, kind, hint(err))}
}

// decodeFrame decodes a frame. In ingress mode every event must name its
// destination topic, as every ingress envelope does.
func decodeFrame(topic string, payload []byte, ingress bool) *Decoded {
	id, events, err := frame.Decode(payload, frame.DefaultLimits)
	if err == nil && ingress {
		for _, e := range events {
			if e.Topic == "" {
				err = fmt.Errorf("%w: event %s has no destination topic, which envelope: ingress needs", frame.ErrMalformed, e.ID)
				break
			}
		}
	}
	if err != nil {
		return &Decoded{Body: payload, Err: fmt.Errorf("message on topic %q is not a valid frame (%d bytes; none of its events is delivered): %w", topic, len(payload), err)}
	}
	return &Decoded{EventID: id, Events: events}
}

// hint adds TraceContextHint to an error about trace context keys.
func hint(err error) error {
	if errors.Is(err, envelope.ErrTraceContext) {
		return fmt.Errorf("%w; %s", err, TraceContextHint)
	}
	return err
}

// AckPayload is the end-to-end ACK of eventID (ReadAck reads it): signed with authKey, or a
// plain reliomq v1 ACK when authKey is nil.
func AckPayload(eventID string, authKey []byte) ([]byte, error) {
	if authKey != nil {
		return envelope.EncodeAuthAck(eventID, authKey)
	}
	return envelope.EncodeAck(eventID)
}

// ErrUnauthenticatedAck is ReadAck's error for an ACK whose auth is missing
// or was made with none of the keys.
var ErrUnauthenticatedAck = errors.New("its auth is missing or was not made with ack_auth_key")

// ReadAck decodes an end-to-end ACK (AckPayload's) and returns the event ID
// it names. With keys (nil: ACKs are not authenticated) its auth must be the
// HMAC of that ID under one of them, or it fails with
// ErrUnauthenticatedAck, the ID still returned for the message.
func ReadAck(payload []byte, keys [][]byte) (string, error) {
	ack, err := envelope.DecodeAuthAck(payload)
	if err != nil {
		return "", err
	}
	if keys != nil && !envelope.VerifyAck(ack, keys) {
		return ack.EventID, ErrUnauthenticatedAck
	}
	return ack.EventID, nil
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

// Encoding is how the output turns a message into the record it stores and
// publishes, so that a resend is byte-identical.
type Encoding struct {
	Mode            string // None, Delivery or Properties
	EndToEnd        bool   // publish to DataTopic, carrying the destination topic
	DataTopic       string
	MaxPayloadBytes int
	// TraceContext: AddTraceContext writes a W3C trace context into the
	// reliomq v1 envelope (Mode Delivery, or EndToEnd without Properties).
	TraceContext bool
}

// Enveloped reports whether e's records are reliomq v1 envelopes, the only
// records that can carry a trace context in their payload.
func (e Encoding) Enveloped() bool {
	return e.Mode == Delivery || e.EndToEnd && e.Mode != Properties
}

// AddTraceContext writes tc into rec's envelope when e.TraceContext is on;
// it leaves rec alone when that would take the payload beyond
// MaxPayloadBytes (a trace context is never worth refusing an event) and
// reports whether it added it.
func (e Encoding) AddTraceContext(rec *mqttmsg.Event, tc envelope.TraceContext) (bool, error) {
	if !e.TraceContext || !e.Enveloped() || tc == (envelope.TraceContext{}) {
		return false, nil
	}
	p, err := envelope.AddTraceContext(rec.Payload, tc)
	if err != nil || len(p) > e.MaxPayloadBytes {
		return false, err
	}
	rec.Payload = p
	return true, nil
}

// SamePayload reports whether two writes' payloads are one record's, apart
// from a trace context in their envelopes (outbox.Options.SamePayload):
// each write of one event carries the trace context of its own span.
func SamePayload(stored, written []byte) bool {
	return bytes.Equal(stored, written) || bytes.Equal(envelope.WithoutTraceContext(stored), envelope.WithoutTraceContext(written))
}

// Encode builds the record of event id for topic from the payload raw and
// the MQTT 5 properties extra (nil: none). It does not check the size (see
// CheckSize).
func (e Encoding) Encode(id, topic string, raw []byte, extra *mqttmsg.Properties) (mqttmsg.Event, error) {
	rec := mqttmsg.Event{EventID: id, Topic: topic, Payload: raw, Props: extra}
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
		return mqttmsg.Event{}, fmt.Errorf("event %s for topic %q cannot be enveloped (the payload must be strict JSON; use envelope: none with confirm: broker for other bytes): %w", id, topic, err)
	}
	return rec, nil
}

// CheckSize refuses a record whose payload exceeds MaxPayloadBytes; topic
// is the destination topic the message was written for.
func (e Encoding) CheckSize(rec mqttmsg.Event, topic string) error {
	if len(rec.Payload) > e.MaxPayloadBytes {
		return fmt.Errorf("event %s for topic %q: payload of %d bytes exceeds max_payload_bytes (%d)", rec.EventID, topic, len(rec.Payload), e.MaxPayloadBytes)
	}
	return nil
}
