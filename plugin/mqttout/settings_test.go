package mqttout

import (
	"strings"
	"testing"
)

// Every number and duration a user can get wrong is refused at start, with
// the field's name and the value given.
func TestParseSettingsRefusesValuesOutOfRange(t *testing.T) {
	const base = "urls: [ \"tcp://127.0.0.1:1883\" ]\ntopic: t\n"
	cases := map[string]string{
		"outbox: { path: ./o.db, max_pending: -1 }\n":              "outbox.max_pending must not be negative, got -1",
		"outbox: { path: ./o.db, max_pending_bytes: -5 }\n":        "outbox.max_pending_bytes must not be negative, got -5",
		"outbox: { path: ./o.db }\nwindow: 0\n":                    "window must be at least 1, got 0",
		"outbox: { path: ./o.db }\nack_timeout: 0s\n":              "ack_timeout must be positive, got 0s",
		"outbox: { path: ./o.db }\npublish_timeout: -1s\n":         "publish_timeout must be positive, got -1s",
		"outbox: { path: ./o.db }\nmax_payload_bytes: 0\n":         "max_payload_bytes must be between 1 and 268369916, got 0",
		"outbox: { path: ./o.db }\nmax_payload_bytes: 268369917\n": "max_payload_bytes must be between 1 and 268369916",
	}
	for conf, want := range cases {
		parsed, err := outputSpec().ParseYAML(base+conf, nil)
		if err != nil {
			t.Fatalf("parse %q: %v", conf, err)
		}
		if _, err := parseSettings(parsed); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", conf, err, want)
		}
	}
	parsed, err := outputSpec().ParseYAML(base+"outbox: { path: ./o.db, max_pending: 0 }\nwindow: 1\nmax_payload_bytes: 268369916\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parseSettings(parsed); err != nil {
		t.Fatalf("the bounds themselves are refused: %v", err)
	}
}
