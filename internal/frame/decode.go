package frame

import (
	"encoding/binary"
	"fmt"
)

// Decode reads a frame strictly: the magic, version 1, a known compression,
// at most lim.MaxEvents events (at least one) in at most lim.MaxDecodedBytes
// decoded bytes, every event as Encode checks it, minimal uvarints, and not
// a byte more or less than the format says. A zero field of lim takes
// DefaultLimits' value. The events' payloads share b's (or the decompressed
// body's) memory. Every error wraps ErrMalformed.
func Decode(b []byte, lim Limits) (id string, events []Event, err error) {
	if lim.MaxEvents <= 0 {
		lim.MaxEvents = DefaultLimits.MaxEvents
	}
	if lim.MaxDecodedBytes <= 0 {
		lim.MaxDecodedBytes = DefaultLimits.MaxDecodedBytes
	}
	if !Is(b) {
		return "", nil, malformedf("no frame magic")
	}
	if len(b) < headerLen {
		return "", nil, malformedf("%d bytes, shorter than the %d-byte header", len(b), headerLen)
	}
	if v := b[len(Magic)]; v != Version {
		return "", nil, malformedf("format version %d; this build reads version %d only", v, Version)
	}
	body := b[headerLen:]
	switch c := b[len(Magic)+1]; c {
	case compNone:
		if len(body) > lim.MaxDecodedBytes {
			return "", nil, malformedf("body of %d bytes exceeds the limit of %d", len(body), lim.MaxDecodedBytes)
		}
	case compZstd:
		if body, err = decompress(body, lim.MaxDecodedBytes); err != nil {
			return "", nil, err
		}
	default:
		return "", nil, malformedf("unknown compression %d", c)
	}
	return decodeBody(body, lim.MaxEvents)
}

// decodeBody reads the event count and the events, refusing trailing bytes.
func decodeBody(body []byte, maxEvents int) (string, []Event, error) {
	r := reader{b: body}
	n, err := r.uvarint("event count")
	if err != nil {
		return "", nil, malformedf("%v", err)
	}
	if n == 0 || n > uint64(maxEvents) {
		return "", nil, malformedf("event count %d is outside 1 to %d", n, maxEvents)
	}
	// An event takes at least minEventLen bytes: no allocation beyond what
	// the body can hold.
	if n > uint64(len(r.b))/minEventLen {
		return "", nil, malformedf("event count %d cannot fit in the %d bytes that follow it", n, len(r.b))
	}
	events := make([]Event, n)
	ids := make([]string, n)
	seen := make(map[string]struct{}, n)
	for i := range events {
		e := &events[i]
		if err := r.event(e); err != nil {
			return "", nil, malformedf("event %d of %d: %v", i+1, n, err)
		}
		if err := checkEvent(e, seen); err != nil {
			return "", nil, malformedf("event %d of %d: %v", i+1, n, err)
		}
		ids[i] = e.ID
	}
	if len(r.b) != 0 {
		return "", nil, malformedf("%d bytes after the last event", len(r.b))
	}
	return ID(ids), events, nil
}

// minEventLen: a one-byte ID with its length, and a zero length for topic,
// property count, traceparent, tracestate and payload.
const minEventLen = 7

type reader struct{ b []byte }

// uvarint reads a minimally encoded uvarint (one value, one encoding).
func (r *reader) uvarint(what string) (uint64, error) {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		return 0, fmt.Errorf("%s: truncated or overlong uvarint", what)
	}
	if n != len(binary.AppendUvarint(nil, v)) {
		return 0, fmt.Errorf("%s: uvarint not minimally encoded", what)
	}
	r.b = r.b[n:]
	return v, nil
}

func (r *reader) bytes(what string) ([]byte, error) {
	n, err := r.uvarint(what + " length")
	if err != nil {
		return nil, err
	}
	if n > uint64(len(r.b)) {
		return nil, fmt.Errorf("%s length %d exceeds the %d bytes left", what, n, len(r.b))
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v, nil
}

func (r *reader) string(what string) (string, error) {
	b, err := r.bytes(what)
	return string(b), err
}

func (r *reader) event(e *Event) (err error) {
	if e.ID, err = r.string("event_id"); err != nil {
		return err
	}
	if e.Topic, err = r.string("topic"); err != nil {
		return err
	}
	np, err := r.uvarint("property count")
	if err != nil {
		return err
	}
	if np > uint64(len(r.b))/2 { // a property takes at least two bytes
		return fmt.Errorf("property count %d cannot fit in the %d bytes left", np, len(r.b))
	}
	if np > 0 {
		e.Properties = make([]Property, np)
	}
	for i := range e.Properties {
		p := &e.Properties[i]
		if p.Key, err = r.string("property name"); err != nil {
			return err
		}
		if p.Value, err = r.string("property value"); err != nil {
			return err
		}
	}
	tp, err := r.string("traceparent")
	if err != nil {
		return err
	}
	ts, err := r.string("tracestate")
	if err != nil {
		return err
	}
	if tp != "" || ts != "" {
		e.Trace = map[string]string{KeyTraceparent: tp}
		if ts != "" {
			e.Trace[KeyTracestate] = ts
		}
	}
	e.Payload, err = r.bytes("payload")
	return err
}
