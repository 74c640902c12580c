package mqttclient

import (
	"errors"
	"fmt"
	"time"
)

// Protocol versions a Config may name. The zero value is MQTT 3.1.1.
const (
	V311 = "3.1.1"
	V5   = "5"
)

// Publication is one outgoing PUBLISH.
type Publication struct {
	Topic    string
	QoS      byte
	Retained bool
	Payload  []byte
	// Props are MQTT 5 properties. A 3.1.1 connection refuses a
	// Publication that carries any (ErrNeedsV5): dropping them silently
	// would lose an event ID sent as a user property.
	Props *Properties
	// RequireSubscribers turns an MQTT 5 PUBACK with reason code 0x10 (no
	// matching subscribers) into a *ReasonCodeError; otherwise 0x10 is a
	// success, as the protocol says. Meaningless on 3.1.1.
	RequireSubscribers bool
}

// Properties are the MQTT 5 PUBLISH properties the components use. A
// 3.1.1 Message has none (Properties returns nil).
type Properties struct {
	// User are the user properties in wire order; a key may repeat.
	User            []UserProperty
	ContentType     string
	ResponseTopic   string
	CorrelationData []byte
	// MessageExpiry is the message expiry interval, whole seconds on the
	// wire; 0 means the message does not expire.
	MessageExpiry time.Duration
}

// UserProperty is one MQTT 5 user property.
type UserProperty struct{ Key, Value string }

// Get returns the value of the first user property named key.
func (p *Properties) Get(key string) (string, bool) {
	if p == nil {
		return "", false
	}
	for _, u := range p.User {
		if u.Key == key {
			return u.Value, true
		}
	}
	return "", false
}

// ServerLimits are what the broker's CONNACK allows. A 3.1.1 connection
// reports NoLimits: that protocol has no way to say otherwise.
type ServerLimits struct {
	// ReceiveMaximum is how many QoS 1/2 publishes may await their
	// acknowledgement at once (65535 when the server sends none).
	ReceiveMaximum uint16
	// MaximumPacketSize is the largest packet the server accepts; 0 means
	// no limit beyond the protocol's.
	MaximumPacketSize uint32
	// MaximumQoS is the highest QoS the server accepts.
	MaximumQoS byte
	// RetainAvailable reports whether the server accepts retained messages.
	RetainAvailable bool
}

// NoLimits are the limits of a server that states none.
var NoLimits = ServerLimits{ReceiveMaximum: 65535, MaximumQoS: 2, RetainAvailable: true}

// ErrNeedsV5 is returned for a Publication with properties on a 3.1.1
// connection.
var ErrNeedsV5 = errors.New("mqtt: MQTT 5 properties on a 3.1.1 connection (set protocol_version: \"5\")")

// ReasonNoMatchingSubscribers is the MQTT 5 PUBACK reason code 0x10.
const ReasonNoMatchingSubscribers byte = 0x10

// ReasonCodeError is an MQTT 5 reason code that failed an operation: a
// PUBACK, SUBACK or CONNACK code of 0x80 or more, or 0x10 for a
// Publication with RequireSubscribers.
type ReasonCodeError struct {
	Packet string // "PUBACK", "SUBACK", "CONNACK"
	Code   byte
	Reason string // the server's reason string, else the protocol's name for Code
	Filter string // for SUBACK: the refused filter
}

func (e *ReasonCodeError) Error() string {
	s := fmt.Sprintf("%s reason code 0x%02x", e.Packet, e.Code)
	if e.Filter != "" {
		s += fmt.Sprintf(" for filter %q", e.Filter)
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}
