package envelope

import "bytes"

// ReadOwnIngress decodes an ingress envelope this package wrote
// (EncodeIngress, AddTraceContext): in that canonical form without building
// a tree, taking the payload as written; anything else strictly, as
// DecodeTracedIngress. A sender packing the envelopes it stored reads each
// again, and the strict decoder cost more than the rest of packing.
func ReadOwnIngress(b []byte) (Ingress, error) {
	if in, ok := splitIngress(b); ok {
		return in, nil
	}
	return DecodeTracedIngress(b)
}

// ReadOwnDelivery is ReadOwnIngress for a delivery envelope.
func ReadOwnDelivery(b []byte) (Delivery, error) {
	if del, ok := splitDelivery(b); ok {
		return del, nil
	}
	return DecodeTracedDelivery(b)
}

// splitIngress reads an ingress envelope in its canonical form; ok is
// false for anything it cannot read as that form (another key order, an
// escape in a string, an invalid field).
func splitIngress(b []byte) (in Ingress, ok bool) {
	s := splitter{b: b}
	id, payload, ok := s.eventHead()
	topic, ok2 := s.stringField(`,"topic":`)
	if !ok || !ok2 || CheckPublishTopic(topic) != nil {
		return Ingress{}, false
	}
	tc, ok := s.traceAndVersion()
	return Ingress{EventID: id, Topic: topic, Payload: payload, Trace: tc}, ok
}

// splitDelivery is splitIngress for a delivery envelope.
func splitDelivery(b []byte) (del Delivery, ok bool) {
	s := splitter{b: b}
	id, payload, ok := s.eventHead()
	if !ok {
		return Delivery{}, false
	}
	tc, ok := s.traceAndVersion()
	return Delivery{EventID: id, Payload: payload, Trace: tc}, ok
}

// splitter walks a canonical envelope front to back; any surprise is !ok.
type splitter struct {
	b   []byte
	pos int
}

// eventHead reads `{"event_id":"…","payload":…`.
func (s *splitter) eventHead() (id string, payload []byte, ok bool) {
	id, ok = s.stringField(`{"event_id":`)
	if !ok || CheckEventID(id) != nil || !s.literal(`,"payload":`) {
		return "", nil, false
	}
	end := skipValue(s.b, s.pos)
	if end <= s.pos {
		return "", nil, false
	}
	payload, s.pos = s.b[s.pos:end], end
	return id, payload, true
}

// traceAndVersion reads the optional trace keys and the closing version.
func (s *splitter) traceAndVersion() (tc TraceContext, ok bool) {
	if s.has(`,"` + KeyTraceparent + `":`) {
		if tc.Traceparent, ok = s.stringField(`,"` + KeyTraceparent + `":`); !ok {
			return tc, false
		}
		if s.has(`,"` + KeyTracestate + `":`) {
			if tc.Tracestate, ok = s.stringField(`,"` + KeyTracestate + `":`); !ok {
				return tc, false
			}
		}
		if CheckTraceContext(tc) != nil {
			return tc, false
		}
	}
	return tc, s.literal(versionTail) && s.pos == len(s.b)
}

func (s *splitter) has(lit string) bool { return bytes.HasPrefix(s.b[s.pos:], []byte(lit)) }

func (s *splitter) literal(lit string) bool {
	if !s.has(lit) {
		return false
	}
	s.pos += len(lit)
	return true
}

// stringField reads key (with its punctuation) and a string without
// escapes or control characters.
func (s *splitter) stringField(key string) (string, bool) {
	if !s.literal(key) || s.pos >= len(s.b) || s.b[s.pos] != '"' {
		return "", false
	}
	for i := s.pos + 1; i < len(s.b); i++ {
		switch c := s.b[i]; {
		case c == '"':
			v := string(s.b[s.pos+1 : i])
			s.pos = i + 1
			return v, true
		case c == '\\' || c < 0x20:
			return "", false
		}
	}
	return "", false
}

// skipValue is the end of the JSON value that starts at b[i] (a string,
// object, array, number or literal), or i when it does not end well. It
// checks only what finding the end needs: the value was written
// canonically.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	depth := 0
	for j := i; j < len(b); j++ {
		switch b[j] {
		case '"':
			end := skipString(b, j)
			if end < 0 {
				return i
			}
			j = end - 1
			if depth == 0 {
				return end
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return j // the end of the envelope's object: a scalar ended
			}
			depth--
			if depth == 0 {
				return j + 1
			}
		case ',':
			if depth == 0 {
				return j
			}
		}
	}
	return i
}

// skipString is the index after the string that starts at b[i], or -1.
func skipString(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}
