package outbox

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// A record's MQTT 5 properties, as a version-3 record stores them:
//
//	form (1 byte, 1) | uvarint count of user properties |
//	  each: uvarint len + key | uvarint len + value |
//	uvarint len + content type | uvarint len + response topic |
//	correlation data: 0 (none) or 1 + uvarint len + bytes |
//	varint message expiry in nanoseconds
//
// They round-trip exactly: user properties in their order, repeated keys
// kept, every byte of keys, values and correlation data as given, nil and
// empty correlation data apart. A record without properties stores none
// (nil Props, a length of 0 before them in the record).
const propsForm = 1

func encodeProps(p *mqttmsg.Properties) []byte {
	if p == nil {
		return nil
	}
	b := []byte{propsForm}
	b = binary.AppendUvarint(b, uint64(len(p.User)))
	for _, u := range p.User {
		b = appendString(b, u.Key)
		b = appendString(b, u.Value)
	}
	b = appendString(b, p.ContentType)
	b = appendString(b, p.ResponseTopic)
	if p.CorrelationData == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = appendString(b, string(p.CorrelationData))
	}
	return binary.AppendVarint(b, int64(p.MessageExpiry))
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// decodeProps reads what encodeProps wrote; the result shares no memory
// with b.
func decodeProps(b []byte) (*mqttmsg.Properties, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != propsForm {
		return nil, fmt.Errorf("unknown properties form %d", b[0])
	}
	b = b[1:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, errors.New("bad user property count")
	}
	b = b[k:]
	p := &mqttmsg.Properties{}
	if n > 0 {
		p.User = make([]mqttmsg.UserProperty, n)
	}
	var err error
	field := func(what string) (f []byte) {
		if err == nil {
			if f, b, err = lengthPrefixed(b); err != nil {
				err = fmt.Errorf("%s: %w", what, err)
			}
		}
		return f
	}
	for i := range p.User {
		p.User[i] = mqttmsg.UserProperty{Key: string(field("user property key")), Value: string(field("user property value"))}
	}
	p.ContentType = string(field("content type"))
	p.ResponseTopic = string(field("response topic"))
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, errors.New("no correlation data marker")
	}
	hasCorrelation := b[0]
	b = b[1:]
	switch hasCorrelation {
	case 0:
	case 1:
		if p.CorrelationData = append([]byte{}, field("correlation data")...); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("bad correlation data marker %d", hasCorrelation)
	}
	expiry, k := binary.Varint(b)
	if k <= 0 || k != len(b) {
		return nil, errors.New("bad message expiry")
	}
	p.MessageExpiry = time.Duration(expiry)
	return p, nil
}

// A version-2 record (before version 3) kept its MQTT 5 properties in its
// topic field, after a NUL, as JSON: no valid MQTT topic contains a NUL
// (envelope.CheckPublishTopic), so a topic without one is a record without
// properties. Such records are still read (splitLegacyTopic); none is
// written any more.
const legacySep = 0

// legacyProps is the JSON form of properties in a version-2 topic, and the
// form `reliable-mqtt outbox` shows properties in (PropertiesJSON).
type legacyProps struct {
	User          [][2]string `json:"user,omitempty"`
	ContentType   string      `json:"content_type,omitempty"`
	ResponseTopic string      `json:"response_topic,omitempty"`
	Correlation   []byte      `json:"correlation_data,omitempty"`
	ExpirySeconds int64       `json:"message_expiry,omitempty"`
}

// splitLegacyTopic splits a version-2 topic field into the publish topic
// and its properties (nil for a topic without a NUL).
func splitLegacyTopic(stored []byte) (topic []byte, p *mqttmsg.Properties, err error) {
	i := bytes.IndexByte(stored, legacySep)
	if i < 0 {
		return stored, nil, nil // no copy: Read's hot path
	}
	var lp legacyProps
	if err := json.Unmarshal(stored[i+1:], &lp); err != nil {
		return nil, nil, fmt.Errorf("unreadable MQTT 5 properties after the topic %q: %v", stored[:i], err)
	}
	p = &mqttmsg.Properties{ContentType: lp.ContentType, ResponseTopic: lp.ResponseTopic,
		CorrelationData: lp.Correlation, MessageExpiry: time.Duration(lp.ExpirySeconds) * time.Second}
	for _, u := range lp.User {
		p.User = append(p.User, mqttmsg.UserProperty{Key: u[0], Value: u[1]})
	}
	return stored[:i], p, nil
}

// PropertiesJSON shows p as JSON (user properties as [name, value] pairs in
// their order, correlation data in base64, message expiry in seconds), or
// returns nil for a record without properties.
func PropertiesJSON(p *mqttmsg.Properties) json.RawMessage {
	if p == nil {
		return nil
	}
	lp := legacyProps{ContentType: p.ContentType, ResponseTopic: p.ResponseTopic, Correlation: p.CorrelationData,
		ExpirySeconds: int64(p.MessageExpiry / time.Second)}
	for _, u := range p.User {
		lp.User = append(lp.User, [2]string{u.Key, u.Value})
	}
	b, err := json.Marshal(lp)
	if err != nil {
		panic("outbox: marshalling strings and bytes cannot fail: " + err.Error())
	}
	return b
}
