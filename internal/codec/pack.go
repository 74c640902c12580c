package codec

import (
	"errors"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/properties"
)

// errNotPackable is FrameEvent's error for an event that rides alone.
var errNotPackable = errors.New("the event cannot ride in a frame")

// Packable reports whether e's events can ride in frames at all: only
// where the receiver reads frames, which is where it reads an envelope
// (envelope: none with confirm: broker reaches plain subscribers).
func (e Encoding) Packable() bool { return e.EndToEnd || e.Mode != None }

// FrameEvent is the stored event ev as a frame carries it (internal/frame):
// its event ID, destination topic (end to end; "" where the frame's topic
// is the destination), the payload the receiver would deliver for it
// alone, its user properties but the envelope's, and the trace context of
// its envelope. topic is the topic its frame is published to: only events
// for one topic share a frame. An event that cannot ride in a frame (MQTT 5
// properties other than user properties, a record that is not in this
// encoding's form) fails, and is published alone, as it is.
func (e Encoding) FrameEvent(ev mqttmsg.Event) (fe frame.Event, topic string, err error) {
	if !e.Packable() {
		return fe, "", errNotPackable
	}
	if p := ev.Props; p != nil && (p.ContentType != "" || p.ResponseTopic != "" || p.CorrelationData != nil || p.MessageExpiry != 0) {
		return fe, "", errNotPackable
	}
	fe.ID, fe.Payload = ev.EventID, ev.Payload
	var tc envelope.TraceContext
	switch {
	case e.Mode == Properties:
		env, err := properties.Read(ev.Props)
		if err != nil || env.EventID != ev.EventID {
			return fe, "", errNotPackable
		}
		fe.Topic = env.DestTopic
	case e.EndToEnd:
		ing, err := envelope.ReadOwnIngress(ev.Payload) // one Encode wrote
		if err != nil || ing.EventID != ev.EventID {
			return fe, "", errNotPackable
		}
		fe.Topic, fe.Payload, tc = ing.Topic, ing.Payload, ing.Trace
	default: // Delivery
		del, err := envelope.ReadOwnDelivery(ev.Payload)
		if err != nil || del.EventID != ev.EventID {
			return fe, "", errNotPackable
		}
		fe.Payload, tc = del.Payload, del.Trace
	}
	if tc.Traceparent != "" {
		fe.Trace = map[string]string{frame.KeyTraceparent: tc.Traceparent}
		if tc.Tracestate != "" {
			fe.Trace[frame.KeyTracestate] = tc.Tracestate
		}
	}
	if ev.Props != nil {
		for _, u := range ev.Props.User {
			if u.Key != properties.KeyEventID && u.Key != properties.KeyDestTopic {
				fe.Properties = append(fe.Properties, frame.Property{Key: u.Key, Value: u.Value})
			}
		}
	}
	return fe, ev.Topic, nil
}
