package frame

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
)

// The trace context keys an event's Trace may hold (the W3C header names).
const (
	KeyTraceparent = envelope.KeyTraceparent
	KeyTracestate  = envelope.KeyTracestate
)

// Encode writes events as one frame and returns it with its ID. Every event
// is checked as Decode checks it, so Encode never writes a frame that
// Decode with DefaultLimits refuses; an error wraps ErrMalformed and names
// the event.
func Encode(events []Event, opt Options) (b []byte, id string, err error) {
	comp := byte(compNone)
	switch opt.Compression {
	case "", None:
	case Zstd:
		comp = compZstd
	default:
		return nil, "", malformedf("compression %q is not one of %q, %q", opt.Compression, None, Zstd)
	}
	if len(events) == 0 || len(events) > MaxEvents {
		return nil, "", malformedf("a frame holds 1 to %d events, not %d", MaxEvents, len(events))
	}
	ids := make([]string, len(events))
	seen := make(map[string]struct{}, len(events))
	body := binary.AppendUvarint(nil, uint64(len(events)))
	for i, e := range events {
		if err := checkEvent(&e, seen); err != nil {
			return nil, "", malformedf("event %d of %d: %v", i+1, len(events), err)
		}
		ids[i] = e.ID
		body = appendEvent(body, &e)
	}
	if len(body) > MaxDecodedBytes {
		return nil, "", malformedf("%d events take %d bytes, more than a frame's %d", len(events), len(body), MaxDecodedBytes)
	}
	b = append(make([]byte, 0, headerLen+len(body)/2+16), Magic...)
	b = append(b, Version, comp)
	if comp == compZstd {
		b = binary.AppendUvarint(b, uint64(len(body)))
		b = encoder.EncodeAll(body, b)
	} else {
		b = append(b, body...)
	}
	return b, ID(ids), nil
}

func appendEvent(b []byte, e *Event) []byte {
	b = appendString(b, e.ID)
	b = appendString(b, e.Topic)
	b = binary.AppendUvarint(b, uint64(len(e.Properties)))
	for _, p := range e.Properties {
		b = appendString(b, p.Key)
		b = appendString(b, p.Value)
	}
	b = appendString(b, e.Trace[KeyTraceparent])
	b = appendString(b, e.Trace[KeyTracestate])
	b = binary.AppendUvarint(b, uint64(len(e.Payload)))
	return append(b, e.Payload...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// checkEvent holds the rules an event in a frame keeps, for both
// directions: a reliomq event ID not seen before in the frame, a publish
// topic or none, MQTT 5 strings as property names and values, and a W3C
// trace context or none. seen collects the IDs.
func checkEvent(e *Event, seen map[string]struct{}) error {
	if err := envelope.CheckEventID(e.ID); err != nil {
		return err
	}
	if _, dup := seen[e.ID]; dup {
		return fmt.Errorf("event_id %q occurs twice in the frame", e.ID)
	}
	seen[e.ID] = struct{}{}
	if e.Topic != "" {
		if err := envelope.CheckPublishTopic(e.Topic); err != nil {
			return fmt.Errorf("event %s: %v", e.ID, err)
		}
	}
	for _, p := range e.Properties {
		if err := checkMQTTString(p.Key); err != nil {
			return fmt.Errorf("event %s: user property name: %v", e.ID, err)
		}
		if err := checkMQTTString(p.Value); err != nil {
			return fmt.Errorf("event %s: user property %q: %v", e.ID, p.Key, err)
		}
	}
	return checkTrace(e)
}

func checkTrace(e *Event) error {
	tc := envelope.TraceContext{Traceparent: e.Trace[KeyTraceparent], Tracestate: e.Trace[KeyTracestate]}
	for k := range e.Trace {
		if k != KeyTraceparent && k != KeyTracestate {
			return fmt.Errorf("event %s: trace context key %q is neither %s nor %s", e.ID, k, KeyTraceparent, KeyTracestate)
		}
	}
	if tc == (envelope.TraceContext{}) {
		return nil
	}
	if err := envelope.CheckTraceContext(tc); err != nil {
		return fmt.Errorf("event %s: %v", e.ID, err)
	}
	return nil
}

// maxMQTTString is the longest MQTT 5 UTF-8 string (a two-byte length).
const maxMQTTString = 65535

func checkMQTTString(s string) error {
	switch {
	case !utf8.ValidString(s):
		return fmt.Errorf("%q is not valid UTF-8", s)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%q contains NUL", s)
	case len(s) > maxMQTTString:
		return fmt.Errorf("%d bytes, more than an MQTT 5 string's %d", len(s), maxMQTTString)
	}
	return nil
}
