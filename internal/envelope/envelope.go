// Package envelope is the reliomq v1 wire protocol: the ingress envelope a
// publisher sends to the bridge, the delivery envelope the bridge publishes
// to the destination topic, and the ACK the bridge sends back.
//
// reliomq is a Python library. It encodes with
//
//	json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
//
// as UTF-8 and decodes strictly. This package emits byte-for-byte the same
// bytes and accepts exactly the messages reliomq accepts (see strictjson.go
// for the JSON rules and canonical.go for the output form), so a Go bridge
// and a Python publisher (or the other way round) interoperate, and a
// retried message always carries identical bytes.
package envelope

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Version is the only protocol version reliomq v1 speaks; every message
// carries it as the JSON integer 1.
const Version = 1

// MaxEventIDLen is the longest event ID reliomq accepts.
const MaxEventIDLen = 128

// MaxTopicBytes is the longest MQTT topic, in UTF-8 bytes.
const MaxTopicBytes = 65535

// ErrMalformed is wrapped by every error this package returns: a received
// message that is not a valid reliomq v1 message (Decode*), and a value that
// cannot be sent in one (Encode*, Canonical, Check*). Such a message will
// never become valid by retrying it.
var ErrMalformed = errors.New("envelope: malformed reliomq v1 message")

// protocolError is the concrete error type: its text says what is wrong and
// it matches ErrMalformed with errors.Is (and also, when set: ErrTraceContext).
type protocolError struct {
	msg  string
	also error
}

func (e *protocolError) Error() string { return "envelope: " + e.msg }
func (e *protocolError) Unwrap() []error {
	if e.also != nil {
		return []error{ErrMalformed, e.also}
	}
	return []error{ErrMalformed}
}

func malformedf(format string, args ...any) error {
	return &protocolError{msg: fmt.Sprintf(format, args...)}
}

// Ingress is a decoded ingress envelope (publisher → bridge).
type Ingress struct {
	EventID string
	Topic   string       // destination topic the bridge publishes to
	Payload []byte       // canonical JSON
	Trace   TraceContext // only from DecodeTracedIngress (see trace.go)
}

// Delivery is a decoded delivery envelope (bridge → destination topic).
type Delivery struct {
	EventID string
	Payload []byte       // canonical JSON
	Trace   TraceContext // only from DecodeTracedDelivery (see trace.go)
}

// EncodeIngress returns the canonical ingress envelope. payload must be
// strict JSON; it is re-emitted canonically.
func EncodeIngress(eventID, topic string, payload []byte) ([]byte, error) {
	if err := CheckEventID(eventID); err != nil {
		return nil, err
	}
	if err := CheckPublishTopic(topic); err != nil {
		return nil, err
	}
	// Keys in sorted order: event_id, payload, topic, version.
	out := make([]byte, 0, len(payload)+len(eventID)+len(topic)+len(`{"event_id":"","payload":,"topic":"","version":1}`))
	out = append(out, `{"event_id":`...)
	out = appendString(out, eventID)
	out = append(out, `,"payload":`...)
	out, err := appendCanonical(out, payload)
	if err != nil {
		return nil, err
	}
	out = append(out, `,"topic":`...)
	out = appendString(out, topic)
	out = append(out, `,"version":1}`...)
	return out, nil
}

// EncodeDelivery returns the canonical delivery envelope.
func EncodeDelivery(eventID string, payload []byte) ([]byte, error) {
	if err := CheckEventID(eventID); err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(payload)+len(eventID)+len(`{"event_id":"","payload":,"version":1}`))
	out = append(out, `{"event_id":`...)
	out = appendString(out, eventID)
	out = append(out, `,"payload":`...)
	out, err := appendCanonical(out, payload)
	if err != nil {
		return nil, err
	}
	out = append(out, `,"version":1}`...)
	return out, nil
}

// EncodeAck returns the canonical ACK for eventID.
func EncodeAck(eventID string) ([]byte, error) {
	if err := CheckEventID(eventID); err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(eventID)+len(`{"event_id":"","version":1}`))
	out = append(out, `{"event_id":`...)
	out = appendString(out, eventID)
	out = append(out, `,"version":1}`...)
	return out, nil
}

// DecodeIngress strictly decodes an ingress envelope: exactly reliomq v1's
// keys (a trace context is refused, see ErrTraceContext).
func DecodeIngress(b []byte) (Ingress, error) { return decodeIngress(b, false) }

// decodeIngress decodes an ingress envelope; traced accepts a trace context
// (DecodeTracedIngress).
func decodeIngress(b []byte, traced bool) (Ingress, error) {
	ev, err := decodeEvent(b, "ingress envelope", traced, "topic")
	if err != nil {
		return Ingress{}, err
	}
	topic, err := topicField(ev.rest[0])
	if err != nil {
		return Ingress{}, err
	}
	return Ingress{EventID: ev.id, Topic: topic, Payload: ev.payload, Trace: ev.trace}, nil
}

// DecodeDelivery strictly decodes a delivery envelope: exactly reliomq v1's
// keys (a trace context is refused, see ErrTraceContext).
func DecodeDelivery(b []byte) (Delivery, error) { return decodeDelivery(b, false) }

// decodeDelivery decodes a delivery envelope; traced accepts a trace
// context (DecodeTracedDelivery).
func decodeDelivery(b []byte, traced bool) (Delivery, error) {
	ev, err := decodeEvent(b, "delivery envelope", traced)
	if err != nil {
		return Delivery{}, err
	}
	return Delivery{EventID: ev.id, Payload: ev.payload, Trace: ev.trace}, nil
}

// event is what every event envelope holds, and the fields of its kind.
type event struct {
	id      string
	payload []byte
	rest    []*value // the kind's own keys, in order
	trace   TraceContext
}

// decodeEvent decodes an event envelope of what: event_id, payload, the
// kind's own keys (which sort between payload and traceparent), with
// traced the optional trace context, and version.
func decodeEvent(b []byte, what string, traced bool, own ...string) (event, error) {
	var keyBuf [8]string // room for every kind's keys: no allocation
	keys := append(append(keyBuf[:0], "event_id", "payload"), own...)
	if traced {
		keys = append(keys, "?traceparent", "?tracestate")
	}
	fields, err := decodeMessage(b, what, append(keys, "version")...)
	if err != nil {
		return event{}, err
	}
	// The canonical payload is rarely longer than the message holding it.
	ev := event{payload: appendValue(make([]byte, 0, len(b)), fields[1]), rest: fields[2 : 2+len(own)]}
	if ev.id, err = eventIDField(fields[0]); err != nil {
		return event{}, err
	}
	if traced {
		if ev.trace, err = traceFields(fields[2+len(own)], fields[3+len(own)]); err != nil {
			return event{}, err
		}
	}
	return ev, nil
}

// DecodeAck strictly decodes an ACK and returns its event ID. An ACK that
// carries "auth" (see EncodeAuthAck) decodes too; its auth is not checked
// here (DecodeAuthAck returns it).
func DecodeAck(b []byte) (eventID string, err error) {
	a, err := DecodeAuthAck(b)
	return a.EventID, err
}

// decodeMessage parses b and checks the parts every message shares: a JSON
// object with exactly the keys named (given in sorted order, a leading '?'
// marks a key that may be absent: its value is then nil) and version 1.
// It returns the values in the order of keys.
func decodeMessage(b []byte, what string, keys ...string) ([]*value, error) {
	v, err := parseStrict(b, 1) // the envelope object wraps the payload
	if err != nil {
		return nil, malformedf("%s is not strict JSON: %v", what, err)
	}
	if v.kind != kindObject {
		return nil, malformedf("%s must be a JSON object, got %s", what, v.kind)
	}
	fields := make([]*value, len(keys))
	var unknown []string
	var also error // ErrTraceContext when an unknown key is a trace key
	for i := range v.members {
		m := &v.members[i]
		found := false
		for k, want := range keys {
			if m.key == strings.TrimPrefix(want, "?") {
				fields[k], found = &m.val, true
				break
			}
		}
		if !found {
			unknown = append(unknown, strconv.Quote(m.key))
			if isTraceKey(m.key) {
				also = ErrTraceContext
			}
		}
	}
	var missing []string
	for k, f := range fields {
		if f == nil && !strings.HasPrefix(keys[k], "?") {
			missing = append(missing, strconv.Quote(keys[k]))
		}
	}
	if len(missing) > 0 || len(unknown) > 0 {
		var parts []string
		if len(missing) > 0 {
			parts = append(parts, "missing key(s) "+strings.Join(missing, ", "))
		}
		if len(unknown) > 0 {
			parts = append(parts, "unknown key(s) "+strings.Join(unknown, ", "))
		}
		names := make([]string, len(keys))
		for k, key := range keys {
			names[k] = key
			if opt, ok := strings.CutPrefix(key, "?"); ok {
				names[k] = opt + " (optional)"
			}
		}
		return nil, &protocolError{msg: fmt.Sprintf("%s has %s; want exactly the keys %s", what, strings.Join(parts, " and "), strings.Join(names, ", ")), also: also}
	}
	// version is always the last key in sorted order.
	if ver := fields[len(fields)-1]; ver.kind != kindNumber || ver.isFloat || ver.text != "1" {
		return nil, malformedf("%s version must be the integer 1, got %s", what, shortJSON(ver))
	}
	return fields, nil
}

func eventIDField(v *value) (string, error) {
	if v.kind != kindString {
		return "", malformedf("event_id must be a JSON string, got %s", v.kind)
	}
	return strings.Clone(v.text), CheckEventID(v.text) // not a view of the whole message
}

func topicField(v *value) (string, error) {
	if v.kind != kindString {
		return "", malformedf("topic must be a JSON string, got %s", v.kind)
	}
	return strings.Clone(v.text), CheckPublishTopic(v.text)
}

// CheckEventID reports whether id matches ^[A-Za-z0-9_-]{1,128}$, the only
// event IDs reliomq accepts.
func CheckEventID(id string) error {
	ok := len(id) >= 1 && len(id) <= MaxEventIDLen
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	if !ok {
		return malformedf("event_id %s does not match ^[A-Za-z0-9_-]{1,128}$", quoteShort(id))
	}
	return nil
}

// CheckPublishTopic reports whether topic is a valid MQTT publish topic by
// reliomq's rules: non-empty, valid UTF-8, no NUL, no wildcard '+' or '#',
// at most 65535 bytes.
func CheckPublishTopic(topic string) error {
	switch {
	case topic == "":
		return malformedf("topic is empty; a publish topic needs at least one character")
	case !utf8.ValidString(topic):
		return malformedf("topic %s is not valid UTF-8", quoteShort(topic))
	case strings.IndexByte(topic, 0) >= 0:
		return malformedf("topic %s contains NUL, which MQTT topics must not contain", quoteShort(topic))
	case strings.ContainsAny(topic, "+#"):
		return malformedf("topic %s contains an MQTT wildcard ('+' or '#'); publish topics must not", quoteShort(topic))
	case len(topic) > MaxTopicBytes:
		return malformedf("topic is %d bytes; MQTT allows at most %d", len(topic), MaxTopicBytes)
	}
	return nil
}

// NewEventID returns a fresh event ID: 32 lowercase hex digits of a
// version 7 UUID (RFC 9562: a 48-bit Unix millisecond timestamp, a counter
// that keeps IDs from one process increasing within a millisecond, 62
// random bits). IDs generated later sort later, so the outbox's event-ID
// index grows at its end instead of splitting pages at random places.
// Not secret and not for names that must not collide by start time: use
// NewRandomID for those.
func NewEventID() string {
	u := uuid.Must(uuid.NewV7()) // fails only if crypto/rand fails, which crashes instead
	return hex.EncodeToString(u[:])
}

// NewRandomID returns 32 lowercase hex digits of a random version 4 UUID,
// the same shape as Python's uuid.uuid4().hex.
func NewRandomID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails; crypto/rand crashes the program instead
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return hex.EncodeToString(b[:])
}

// quoteShort quotes s for an error message, cutting very long strings (an
// attacker-sized event ID should not become an attacker-sized log line).
func quoteShort(s string) string {
	const max = 64
	if len(s) <= max {
		return strconv.Quote(s)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// shortJSON renders v canonically for an error message, cut if long.
func shortJSON(v *value) string {
	s := string(appendValue(nil, v))
	if len(s) > 64 {
		cut := 64
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
	}
	return s
}
