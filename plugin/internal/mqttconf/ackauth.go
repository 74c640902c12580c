package mqttconf

import (
	"fmt"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/conffield"
)

// Field names of the ACK authentication both plugins take.
const (
	FieldAckAuthKey  = "ack_auth_key"
	FieldAckAuthKeys = "ack_auth_keys"
)

// AckAuthFields declare the shared key (or keys, for rotation) of
// authenticated end-to-end ACKs; use says what the key does in the
// component.
func AckAuthFields(use string) []*service.ConfigField {
	return []*service.ConfigField{
		service.NewStringField(FieldAckAuthKey).
			Description("A secret shared by the `reliable_mqtt_in` that sends end-to-end ACKs and the `reliable_mqtt_out` that waits for them. " + use + " Empty (the default): ACKs are plain reliomq v1 messages. It authenticates the ACK's sender against anyone else who can publish on the ACK topic; TLS and broker ACLs on the ACK topic remain the first line of defence.").
			Default("").Secret().Advanced(),
		service.NewStringListField(FieldAckAuthKeys).
			Description("Instead of `ack_auth_key`, for key rotation: the first key signs, any key verifies. Roll out a new key by putting it second everywhere, then first, then dropping the old one.").
			Default([]string{}).Secret().Advanced(),
	}
}

// ParseAckAuthKeys reads AckAuthFields: nil when ACKs are not
// authenticated, else the keys with the signing key first.
func ParseAckAuthKeys(pc *service.ParsedConfig) ([][]byte, error) {
	var one string
	var list []string
	if err := conffield.Read(pc, conffield.String(&one, FieldAckAuthKey), conffield.StringList(&list, FieldAckAuthKeys)); err != nil {
		return nil, err
	}
	if one != "" && len(list) > 0 {
		return nil, fmt.Errorf("set %s or %s, not both", FieldAckAuthKey, FieldAckAuthKeys)
	}
	if one != "" {
		list = []string{one}
	}
	var keys [][]byte
	for i, k := range list {
		if k == "" {
			return nil, fmt.Errorf("%s[%d] is empty", FieldAckAuthKeys, i)
		}
		keys = append(keys, []byte(k))
	}
	return keys, nil
}
