package mqttin

import (
	"strings"
	"testing"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"
)

// Configurations the input refuses at start are refused by `lint` too,
// with the same words, and a valid one is not.
func TestLintRefusesWhatStartRefuses(t *testing.T) {
	const base = "urls: [ \"tcp://127.0.0.1:1883\" ]\ntopics: [ t ]\n"
	cases := map[string]struct{ conf, want string }{
		"envelope properties on 3.1.1":   {base + "client_id: c\nenvelope: properties\n", "MQTT 5 only"},
		"session expiry on 3.1.1":        {base + "client_id: c\nsession_expiry_interval: 1h\n", "MQTT 5 only"},
		"empty client_id":                {base + "client_id: \"\"\n", "client_id must not be empty"},
		"ack_topic without envelope":     {base + "client_id: c\nack_topic: acks\n", "ack_topic needs envelope"},
		"ack_auth_key without ack_topic": {base + "client_id: c\nenvelope: ingress\nack_auth_key: k\n", "ack_auth_key needs ack_topic"},
		"qos 3":                          {base + "client_id: c\nqos: 3\n", "qos must be 0, 1 or 2"},
		"trace_context without envelope": {base + "client_id: c\ntrace_context: envelope\n", "trace_context: envelope needs envelope: ingress or delivery"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			conf, err := inputSpec().ParseYAML(c.conf, nil)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if _, err := parseSettings(conf); err == nil {
				t.Fatalf("parseSettings accepts it; the case is wrong:\n%s", c.conf)
			}
			lintErr := lintInput(c.conf)
			if lintErr == nil || !strings.Contains(lintErr.Error(), c.want) {
				t.Fatalf("lint: %v; want an error containing %q", lintErr, c.want)
			}
		})
	}
	valid := base + "client_id: c\nprotocol_version: \"5\"\nenvelope: properties\nack_topic: acks\nack_auth_keys: [ k ]\nsession_expiry_interval: 1h\n"
	if err := lintInput(valid); err != nil {
		t.Fatalf("lint refuses a valid config: %v", err)
	}
	if err := lintInput(base + "client_id: c\nenvelope: delivery\ntrace_context: envelope\n"); err != nil {
		t.Fatalf("lint refuses trace_context: envelope with envelope: delivery: %v", err)
	}
}

// lintInput lints a pipeline whose input is reliable_mqtt_in with conf.
func lintInput(conf string) error {
	indented := "    " + strings.ReplaceAll(strings.TrimSuffix(conf, "\n"), "\n", "\n    ")
	return service.NewStreamBuilder().SetYAML("input:\n  reliable_mqtt_in:\n" + indented + "\noutput:\n  drop: {}\n")
}
