package mqttout

import (
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// Configurations the output refuses at start are refused by `lint` too,
// with the same words, and a valid one is not.
func TestLintRefusesWhatStartRefuses(t *testing.T) {
	const base = "urls: [ \"tcp://127.0.0.1:1883\" ]\ntopic: t\n"
	cases := map[string]struct{ conf, want string }{
		"MQTT 5 fields on 3.1.1":              {base + "outbox: { path: ./o.db }\nuser_properties: { site: a }\ncontent_type: text/plain\n", "MQTT 5 only"},
		"envelope properties on 3.1.1":        {base + "outbox: { path: ./o.db }\nenvelope: properties\n", "MQTT 5 only"},
		"session expiry on 3.1.1":             {base + "outbox: { path: ./o.db }\nsession_expiry_interval: 1h\n", "MQTT 5 only"},
		"require_subscribers with end_to_end": {base + "outbox: { path: ./o.db }\nprotocol_version: \"5\"\nconfirm: end_to_end\nrequire_subscribers: true\n", "require_subscribers applies to confirm: broker"},
		"retained with end_to_end":            {base + "outbox: { path: ./o.db }\nconfirm: end_to_end\nretained: true\n", "retained does not apply"},
		"retained interpolated with outbox":   {base + "outbox: { path: ./o.db }\nretained: '${! meta(\"r\") }'\n", "retained: an interpolation needs outbox.enabled: false"},
		"outbox without path":                 {base, "outbox.path is required"},
		"delivery envelope with end_to_end":   {base + "outbox: { path: ./o.db }\nconfirm: end_to_end\nenvelope: delivery\n", "envelope: delivery applies to confirm: broker"},
		"ack_auth_key with confirm broker":    {base + "outbox: { path: ./o.db }\nack_auth_key: k\n", "ack_auth_key applies to confirm: end_to_end"},
		"trace_context envelope, no envelope": {base + "outbox: { path: ./o.db }\ntrace_context: envelope\n", "trace_context: envelope needs a reliomq v1 envelope"},
		"trace_context envelope, properties":  {base + "outbox: { path: ./o.db }\nprotocol_version: \"5\"\nconfirm: end_to_end\nenvelope: properties\ntrace_context: envelope\n", "trace_context: envelope needs a reliomq v1 envelope"},
		"reserved user property":              {base + "outbox: { path: ./o.db }\nprotocol_version: \"5\"\nuser_properties: { event_id: x }\n", "reserved for envelope: properties"},
		"pack without an envelope":            {base + "outbox: { path: ./o.db }\npack: { max_events: 64 }\n", "a plain subscriber cannot read frames"},
		"pack with retained interpolated":     {base + "outbox: { enabled: false }\nenvelope: delivery\nretained: '${! meta(\"r\") }'\npack: { max_events: 64 }\n", "a retained frame"},
		"pack with message_expiry":            {base + "outbox: { path: ./o.db }\nprotocol_version: \"5\"\nenvelope: properties\nmessage_expiry: 1h\npack: { max_events: 64 }\n", "a frame carries user properties only"},
		"pack with retained":                  {base + "outbox: { path: ./o.db }\nenvelope: delivery\nretained: true\npack: { max_events: 64 }\n", "a retained frame"},
		"pack with content_type":              {base + "outbox: { path: ./o.db }\nprotocol_version: \"5\"\nenvelope: properties\ncontent_type: text/plain\npack: { max_events: 64 }\n", "a frame carries user properties only"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			conf, err := outputSpec().ParseYAML(c.conf, nil)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if _, err := parseSettings(conf); err == nil {
				t.Fatalf("parseSettings accepts it; the case is wrong:\n%s", c.conf)
			}
			lintErr := lintOutput(c.conf)
			if lintErr == nil || !strings.Contains(lintErr.Error(), c.want) {
				t.Fatalf("lint: %v; want an error containing %q", lintErr, c.want)
			}
		})
	}
	valid := base + "outbox: { path: ./o.db }\nconfirm: end_to_end\nack_auth_keys: [ k1, k2 ]\ntrace_context: envelope\npack: { max_events: 64 }\n"
	if err := lintOutput(valid); err != nil {
		t.Fatalf("lint refuses a valid config: %v", err)
	}
	v5 := base + "outbox: { enabled: false }\nprotocol_version: \"5\"\nenvelope: properties\nuser_properties: { site: a }\nrequire_subscribers: true\nretained: '${! meta(\"r\") }'\n"
	if err := lintOutput(v5); err != nil {
		t.Fatalf("lint refuses a valid MQTT 5 config: %v", err)
	}
	delivery := base + "outbox: { path: ./o.db }\nenvelope: delivery\npack: { max_events: 64, compression: none }\n"
	if err := lintOutput(delivery); err != nil {
		t.Fatalf("lint refuses pack with envelope: delivery: %v", err)
	}
	direct := base + "outbox: { enabled: false }\nconfirm: end_to_end\npack: { max_events: 64 }\n"
	if err := lintOutput(direct); err != nil {
		t.Fatalf("lint refuses pack in direct mode: %v", err)
	}
}

// lintOutput lints a pipeline whose output is reliable_mqtt_out with conf.
func lintOutput(conf string) error {
	indented := "    " + strings.ReplaceAll(strings.TrimSuffix(conf, "\n"), "\n", "\n    ")
	return service.NewStreamBuilder().SetYAML("input:\n  generate: { mapping: 'root = {}' }\noutput:\n  reliable_mqtt_out:\n" + indented + "\n")
}
