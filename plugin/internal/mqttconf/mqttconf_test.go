package mqttconf_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/mqttconf"
)

func parse(t *testing.T, yaml string) (mqttclient.Config, error) {
	t.Helper()
	spec := service.NewConfigSpec().Fields(mqttconf.ConnectionFields()...)
	pc, err := spec.ParseYAML("urls: [ tcp://127.0.0.1:1883 ]\n"+yaml, nil)
	if err != nil {
		t.Fatalf("parse %q: %v", yaml, err)
	}
	return mqttconf.ParseConfig(pc)
}

func TestParseConfigReadsProtocolVersionAndSessionExpiry(t *testing.T) {
	ok := map[string]mqttclient.Config{
		"":                        {ProtocolVersion: mqttclient.V311, SessionExpiry: mqttclient.SessionExpiryDefault},
		"protocol_version: \"5\"": {ProtocolVersion: mqttclient.V5, SessionExpiry: mqttclient.SessionExpiryDefault},
		"protocol_version: 5\nsession_expiry_interval: 1h":     {ProtocolVersion: mqttclient.V5, SessionExpiry: time.Hour},
		"protocol_version: \"5\"\nsession_expiry_interval: 0s": {ProtocolVersion: mqttclient.V5, SessionExpiry: 0},
	}
	for yaml, want := range ok {
		got, err := parse(t, yaml)
		if err != nil {
			t.Errorf("%q: %v", yaml, err)
			continue
		}
		if got.ProtocolVersion != want.ProtocolVersion || got.SessionExpiry != want.SessionExpiry {
			t.Errorf("%q: protocol %q expiry %s, want %q %s", yaml, got.ProtocolVersion, got.SessionExpiry, want.ProtocolVersion, want.SessionExpiry)
		}
	}
	bad := map[string]string{
		"session_expiry_interval: 1h":                           "applies to MQTT 5 only",
		"protocol_version: \"4\"":                               "protocol_version",
		"protocol_version: \"5\"\nsession_expiry_interval: -1s": "negative",
	}
	for yaml, want := range bad {
		if _, err := parse(t, yaml); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error mentioning %q", yaml, err, want)
		}
	}
}
