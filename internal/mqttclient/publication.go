package mqttclient

import (
	"errors"
	"fmt"
)

// Protocol versions a Config may name. The zero value is MQTT 3.1.1.
const (
	V311 = "3.1.1"
	V5   = "5"
)

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
