package envelope

import (
	"bytes"
	"errors"
	"strings"
)

// Trace context in envelopes (an opt-in extension of reliomq v1, like the
// ACK's "auth"). On MQTT 3.1.1 there are no user properties, so an event's
// W3C trace context (https://www.w3.org/TR/trace-context/) can only travel
// in the payload. With the opt-in (the plugins' `trace_context: envelope`,
// on the sending and the receiving side) the ingress and delivery envelopes
// gain two keys, in the same canonical form as the rest:
//
//	{"event_id":"e1","payload":{},"topic":"t","traceparent":"00-…-…-01","tracestate":"k=v","version":1}
//
// "tracestate" only when there is one. reliomq v1 knows neither key and
// refuses the message, so the keys are written only when asked for: without
// a trace context the envelope is exactly the reliomq v1 bytes. A decoder
// without the opt-in keeps refusing them (the v1 contract), and says so with
// ErrTraceContext so the error can name the setting.

// Keys of the trace context in an envelope: the W3C header names.
const (
	KeyTraceparent = "traceparent"
	KeyTracestate  = "tracestate"
)

// TraceContext is the W3C trace context an envelope carries; the zero value
// is none.
type TraceContext struct {
	Traceparent string // version 00: "00-" 32 hex trace ID "-" 16 hex parent ID "-" 2 hex flags
	Tracestate  string // "" when none
}

// ErrTraceContext is wrapped, besides ErrMalformed, by the error of a
// decoder without the opt-in (DecodeIngress, DecodeDelivery) for an envelope
// that carries a trace context key: the sender opted in, this side did not.
var ErrTraceContext = errors.New("envelope: trace context keys in a reliomq v1 envelope")

// versionTail is how every canonical ingress and delivery envelope ends:
// "version" sorts after every other key, the trace keys included.
const versionTail = `,"version":1}`

// AddTraceContext returns env, a canonical ingress or delivery envelope as
// EncodeIngress and EncodeDelivery make them (without a trace context), with
// tc's keys added in canonical position (before "version", the last key).
// A zero tc returns env itself: the reliomq v1 bytes.
func AddTraceContext(env []byte, tc TraceContext) ([]byte, error) {
	if tc == (TraceContext{}) {
		return env, nil
	}
	if err := CheckTraceContext(tc); err != nil {
		return nil, err
	}
	// Parsing env again only when a trace key could be in it keeps the
	// common case (a payload without those words) at one copy.
	mayHave := bytes.Contains(env, []byte(`"`+KeyTraceparent+`":`)) || bytes.Contains(env, []byte(`"`+KeyTracestate+`":`))
	if !bytes.HasSuffix(env, []byte(versionTail)) || mayHave && hasTraceKey(env) {
		return nil, malformedf("a trace context can be added only to a canonical ingress or delivery envelope without one")
	}
	head := env[:len(env)-len(versionTail)]
	out := make([]byte, 0, len(env)+len(tc.Traceparent)+len(tc.Tracestate)+32)
	out = append(out, head...)
	out = append(out, `,"traceparent":`...)
	out = appendString(out, tc.Traceparent)
	if tc.Tracestate != "" {
		out = append(out, `,"tracestate":`...)
		out = appendString(out, tc.Tracestate)
	}
	return append(out, versionTail...), nil
}

// hasTraceKey reports whether the envelope object env has a trace key of its
// own (a payload may contain one; that is not the envelope's).
func hasTraceKey(env []byte) bool {
	v, err := parseStrict(env, 1)
	return err == nil && v.kind == kindObject && traceKeyIndex(&v) >= 0
}

// traceKeyIndex is the index of v's first trace key member, -1 when none.
func traceKeyIndex(v *value) int {
	for i := range v.members {
		if isTraceKey(v.members[i].key) {
			return i
		}
	}
	return -1
}

func hasKey(v *value, k string) bool {
	for i := range v.members {
		if v.members[i].key == k {
			return true
		}
	}
	return false
}

func isTraceKey(k string) bool { return k == KeyTraceparent || k == KeyTracestate }

// DecodeTracedIngress decodes an ingress envelope that may carry a trace
// context (and must otherwise be exactly reliomq v1's); Ingress.Trace is
// zero when it carries none.
func DecodeTracedIngress(b []byte) (Ingress, error) { return decodeIngress(b, true) }

// DecodeTracedDelivery decodes a delivery envelope that may carry a trace
// context; Delivery.Trace is zero when it carries none.
func DecodeTracedDelivery(b []byte) (Delivery, error) { return decodeDelivery(b, true) }

// traceFields reads the optional trace keys' values (nil: absent).
func traceFields(parent, state *value) (TraceContext, error) {
	var tc TraceContext
	for _, f := range []struct {
		v   *value
		key string
		dst *string
	}{{parent, KeyTraceparent, &tc.Traceparent}, {state, KeyTracestate, &tc.Tracestate}} {
		if f.v == nil {
			continue
		}
		if f.v.kind != kindString {
			return TraceContext{}, malformedf("%s must be a JSON string, got %s", f.key, f.v.kind)
		}
		*f.dst = strings.Clone(f.v.text) // not a view of the whole message
	}
	if parent == nil && state == nil {
		return tc, nil
	}
	if state != nil && tc.Tracestate == "" {
		// AddTraceContext leaves the key out instead; one form per context.
		return TraceContext{}, malformedf("tracestate is empty; an envelope without one leaves the key out")
	}
	return tc, CheckTraceContext(tc)
}

// CheckTraceContext reports whether tc is a trace context an envelope may
// carry: a traceparent of W3C version 00 (the only version defined, and the
// one OpenTelemetry writes) with a trace ID and a parent ID that are not all
// zeros, and a tracestate ("" or printable ASCII) only beside a traceparent.
// (A decoded envelope's "tracestate", when present, must not be empty.)
func CheckTraceContext(tc TraceContext) error {
	tp := tc.Traceparent
	switch {
	case tp == "" && tc.Tracestate != "":
		return malformedf("tracestate without traceparent")
	case tp == "":
		return malformedf("traceparent is empty")
	}
	const form = `traceparent %s is not a W3C version 00 traceparent ("00-" 32 lowercase hex digits of a trace ID "-" 16 of a parent ID "-" 2 of flags, the IDs not all zeros)`
	ok := len(tp) == 55 && tp[:3] == "00-" && tp[35] == '-' && tp[52] == '-' &&
		isLowerHex(tp[3:35]) && isLowerHex(tp[36:52]) && isLowerHex(tp[53:]) &&
		tp[3:35] != "00000000000000000000000000000000" && tp[36:52] != "0000000000000000"
	if !ok {
		return malformedf(form, quoteShort(tp))
	}
	for i := 0; i < len(tc.Tracestate); i++ {
		if c := tc.Tracestate[i]; c < 0x20 || c > 0x7e {
			return malformedf("tracestate %s has a character outside printable ASCII", quoteShort(tc.Tracestate))
		}
	}
	return nil
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// WithoutTraceContext returns the envelope env without its trace context
// keys, canonically; env itself when it is not an envelope (a JSON object
// with "event_id" and "version") or has none.
// Two writes of one event differ in their trace context (a new span each
// time) and in nothing else: compare them without it.
func WithoutTraceContext(env []byte) []byte {
	v, err := parseStrict(env, 1)
	if err != nil || v.kind != kindObject || traceKeyIndex(&v) < 0 || !hasKey(&v, "event_id") || !hasKey(&v, "version") {
		return env
	}
	kept := v.members[:0:0]
	for _, m := range v.members {
		if !isTraceKey(m.key) {
			kept = append(kept, m)
		}
	}
	v.members = kept
	return appendValue(make([]byte, 0, len(env)), &v)
}
