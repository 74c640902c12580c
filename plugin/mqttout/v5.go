package mqttout

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/properties"
)

// v5Fields are the MQTT 5 settings: properties of each publish and
// require_subscribers.
type v5Fields struct {
	userProps          map[string]*service.InterpolatedString
	contentType        *service.InterpolatedString // nil: none
	messageExpiry      *service.InterpolatedString // nil: none
	requireSubscribers bool
}

// hasProps reports whether a publish carries properties beyond the envelope's.
func (f v5Fields) hasProps() bool {
	return len(f.userProps) > 0 || f.contentType != nil || f.messageExpiry != nil
}

// parseV5Fields reads the MQTT 5 fields; each is refused on 3.1.1, where
// it could not be honoured, rather than ignored.
func parseV5Fields(conf *service.ParsedConfig, version string, propsEnv, endToEnd bool) (f v5Fields, err error) {
	if f.userProps, err = conf.FieldInterpolatedStringMap(fieldUserProperties); err != nil {
		return f, err
	}
	for name := range f.userProps {
		if name == properties.KeyEventID || name == properties.KeyDestTopic {
			return f, fmt.Errorf("%s: %q is reserved for envelope: properties", fieldUserProperties, name)
		}
		if err := properties.CheckString(fieldUserProperties+" name", name); err != nil {
			return f, err
		}
	}
	if f.contentType, err = optionalInterpolation(conf, fieldContentType); err != nil {
		return f, err
	}
	if f.messageExpiry, err = optionalInterpolation(conf, fieldMessageExpiry); err != nil {
		return f, err
	}
	if raw, _ := conf.FieldString(fieldMessageExpiry); raw != "" && !strings.Contains(raw, "${!") {
		if _, err := properties.ParseExpiry(raw); err != nil {
			return f, err
		}
	}
	if f.requireSubscribers, err = conf.FieldBool(fieldRequireSubs); err != nil {
		return f, err
	}
	if f.requireSubscribers && endToEnd {
		return f, errors.New("require_subscribers applies to confirm: broker; with confirm: end_to_end only the receiver's ACK confirms a record, so a missing subscriber already keeps it")
	}
	if version == mqttclient.V5 {
		return f, nil
	}
	var set []string
	if propsEnv {
		set = append(set, "envelope: properties")
	}
	if len(f.userProps) > 0 {
		set = append(set, fieldUserProperties)
	}
	if f.contentType != nil {
		set = append(set, fieldContentType)
	}
	if f.messageExpiry != nil {
		set = append(set, fieldMessageExpiry)
	}
	if f.requireSubscribers {
		set = append(set, fieldRequireSubs)
	}
	if len(set) > 0 {
		return f, fmt.Errorf("%s: MQTT 5 only: set protocol_version: \"5\" (the broker must speak it), or remove them", strings.Join(set, ", "))
	}
	return f, nil
}

// optionalInterpolation reads an interpolated string field; nil when empty.
func optionalInterpolation(conf *service.ParsedConfig, name string) (*service.InterpolatedString, error) {
	if raw, err := conf.FieldString(name); err != nil || raw == "" {
		return nil, err
	}
	return conf.FieldInterpolatedString(name)
}

// props evaluates the MQTT 5 properties of msg; nil when none are set.
func (f v5Fields) props(msg *service.Message) (*mqttmsg.Properties, error) {
	if !f.hasProps() {
		return nil, nil
	}
	var o properties.Outgoing
	if len(f.userProps) > 0 {
		o.User = make(map[string]string, len(f.userProps))
		for name, is := range f.userProps {
			v, err := is.TryString(msg)
			if err != nil {
				return nil, fmt.Errorf("user property %q: interpolation failed: %w", name, err)
			}
			o.User[name] = v
		}
	}
	var err error
	if f.contentType != nil {
		if o.ContentType, err = f.contentType.TryString(msg); err != nil {
			return nil, fmt.Errorf("content_type interpolation failed: %w", err)
		}
	}
	if f.messageExpiry != nil {
		if o.MessageExpiry, err = f.messageExpiry.TryString(msg); err != nil {
			return nil, fmt.Errorf("message_expiry interpolation failed: %w", err)
		}
	}
	return o.Properties()
}
