// Package properties is what reliable-mqtt does with MQTT 5 PUBLISH
// properties, without Benthos: the event ID and destination topic carried
// as user properties (`envelope: properties`), received properties as
// metadata, and the properties reliable_mqtt_out's fields give a message.
// An outbox record keeps its properties in a field of its own
// (internal/outbox, props.go).
package properties

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// User property names of `envelope: properties`: the same names, and the
// same values, as the fields of the reliomq v1 ingress envelope.
const (
	KeyEventID   = "event_id"
	KeyDestTopic = "destination_topic"
)

// Stamp returns the properties of a publish under `envelope: properties`:
// event_id first, then destination_topic when destTopic is not empty (the
// ingress hop), then the user properties of extra in their order, and the
// other properties of extra. extra may be nil and is not modified.
func Stamp(extra *mqttmsg.Properties, eventID, destTopic string) *mqttmsg.Properties {
	p := &mqttmsg.Properties{}
	if extra != nil {
		*p = *extra
	}
	user := []mqttmsg.UserProperty{{Key: KeyEventID, Value: eventID}}
	if destTopic != "" {
		user = append(user, mqttmsg.UserProperty{Key: KeyDestTopic, Value: destTopic})
	}
	p.User = append(user, p.User...)
	return p
}

// Envelope is what `envelope: properties` carries.
type Envelope struct {
	EventID   string
	DestTopic string // empty: the message names no destination (a delivery hop)
}

// Read takes the event ID and destination topic from a received message's
// user properties. An error (which wraps envelope.ErrMalformed) means the
// message is malformed for `envelope: properties`: no event_id (a 3.1.1
// message has no properties at all), an invalid one, two of either, or an
// invalid destination topic.
func Read(p *mqttmsg.Properties) (Envelope, error) {
	var e Envelope
	if p == nil {
		return e, fmt.Errorf("%w: no MQTT 5 properties (an MQTT 3.1.1 publish, or one without user properties), so no %s user property", envelope.ErrMalformed, KeyEventID)
	}
	var ids, dests int
	for _, u := range p.User {
		switch u.Key {
		case KeyEventID:
			ids++
			e.EventID = u.Value
		case KeyDestTopic:
			dests++
			e.DestTopic = u.Value
		}
	}
	switch {
	case ids == 0:
		return Envelope{}, fmt.Errorf("%w: no %s user property", envelope.ErrMalformed, KeyEventID)
	case ids > 1 || dests > 1:
		return Envelope{}, fmt.Errorf("%w: %d %s and %d %s user properties; at most one of each", envelope.ErrMalformed, ids, KeyEventID, dests, KeyDestTopic)
	}
	if err := envelope.CheckEventID(e.EventID); err != nil {
		return Envelope{}, err
	}
	if dests == 1 {
		if err := envelope.CheckPublishTopic(e.DestTopic); err != nil {
			return Envelope{}, fmt.Errorf("%s: %w", KeyDestTopic, err)
		}
	}
	return e, nil
}

// Metadata names under which reliable_mqtt_in exposes received properties.
const (
	MetaUserPrefix      = "mqtt_user_property_"
	MetaContentType     = "mqtt_content_type"
	MetaResponseTopic   = "mqtt_response_topic"
	MetaCorrelationData = "mqtt_correlation_data"
	MetaMessageExpiry   = "mqtt_message_expiry"
)

// Metadata calls set once for each metadata key that p yields, in a fixed
// order: each user property as mqtt_user_property_<name> (a string; a name
// that occurs more than once yields a list of its values, as strings, in
// the order they arrived), then the content type, response topic,
// correlation data (its bytes as they are) and message expiry (whole
// seconds, e.g. "60s") when present. Nothing for nil.
func Metadata(p *mqttmsg.Properties, set func(key string, value any)) {
	if p == nil {
		return
	}
	var order []string
	values := map[string][]string{}
	for _, u := range p.User {
		if _, seen := values[u.Key]; !seen {
			order = append(order, u.Key)
		}
		values[u.Key] = append(values[u.Key], u.Value)
	}
	for _, k := range order {
		vs := values[k]
		if len(vs) == 1 {
			set(MetaUserPrefix+k, vs[0])
			continue
		}
		list := make([]any, len(vs))
		for i, v := range vs {
			list[i] = v
		}
		set(MetaUserPrefix+k, list)
	}
	if p.ContentType != "" {
		set(MetaContentType, p.ContentType)
	}
	if p.ResponseTopic != "" {
		set(MetaResponseTopic, p.ResponseTopic)
	}
	if len(p.CorrelationData) > 0 {
		set(MetaCorrelationData, string(p.CorrelationData))
	}
	if p.MessageExpiry > 0 {
		set(MetaMessageExpiry, strconv.FormatInt(int64(p.MessageExpiry/time.Second), 10)+"s")
	}
}

// maxString is the longest MQTT 5 UTF-8 string (a two-byte length).
const maxString = 65535

// CheckString reports whether s can be sent as an MQTT 5 UTF-8 string
// (a user property name or value, a content type): valid UTF-8, no NUL,
// at most 65535 bytes. what names s in the error.
func CheckString(what, s string) error {
	switch {
	case !utf8.ValidString(s):
		return fmt.Errorf("%s %q is not valid UTF-8, which MQTT 5 strings must be", what, s)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%s %q contains NUL, which MQTT 5 strings must not", what, s)
	case len(s) > maxString:
		return fmt.Errorf("%s is %d bytes; MQTT 5 strings hold at most %d", what, len(s), maxString)
	}
	return nil
}

// ParseExpiry reads a message expiry: a Go duration ("90s", "1h") or a
// whole number of seconds ("90", as MetaMessageExpiry without its "s"
// would be). It must be whole seconds, at least one, and fit the
// protocol's four bytes. "" means no expiry (0).
func ParseExpiry(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if n, nerr := strconv.ParseInt(s, 10, 64); nerr == nil {
		d, err = time.Duration(n)*time.Second, nil
	}
	switch {
	case err != nil:
		return 0, fmt.Errorf("message_expiry %q is neither a duration (90s) nor whole seconds (90)", s)
	case d < time.Second || d%time.Second != 0:
		return 0, fmt.Errorf("message_expiry %q: MQTT 5 counts it in whole seconds, at least 1", s)
	case d > time.Duration(0xFFFFFFFF)*time.Second:
		return 0, fmt.Errorf("message_expiry %q exceeds the protocol's maximum of 4294967295 seconds", s)
	}
	return d, nil
}

// Outgoing are the MQTT 5 properties of one message as reliable_mqtt_out's
// fields evaluate them: strings, checked by Properties.
type Outgoing struct {
	User          map[string]string // name → value
	ContentType   string            // "": none
	MessageExpiry string            // ParseExpiry's forms; "": none
}

// Properties checks o and returns its properties, the user properties
// sorted by name so that equal fields give equal records.
func (o Outgoing) Properties() (*mqttmsg.Properties, error) {
	p := &mqttmsg.Properties{User: sortedUser(o.User), ContentType: o.ContentType}
	for _, u := range p.User {
		if err := CheckString("user property "+u.Key, u.Value); err != nil {
			return nil, err
		}
	}
	if err := CheckString("content_type", o.ContentType); err != nil {
		return nil, err
	}
	var err error
	if p.MessageExpiry, err = ParseExpiry(o.MessageExpiry); err != nil {
		return nil, err
	}
	return p, nil
}

// sortedUser turns a map of user properties into a list sorted by name.
func sortedUser(m map[string]string) []mqttmsg.UserProperty {
	if len(m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]mqttmsg.UserProperty, len(keys))
	for i, k := range keys {
		out[i] = mqttmsg.UserProperty{Key: k, Value: m[k]}
	}
	return out
}
