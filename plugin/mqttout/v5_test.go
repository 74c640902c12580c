package mqttout_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
)

// startErr builds and runs a stream with output YAML and returns the error
// the output's constructor gave, or nil if the stream was still running
// after a moment.
func startErr(t *testing.T, outputYAML string) error {
	t.Helper()
	sb := service.NewStreamBuilder()
	if _, err := sb.AddProducerFunc(); err != nil {
		t.Fatal(err)
	}
	if err := sb.AddOutputYAML(outputYAML); err != nil {
		return err
	}
	stream, err := sb.Build()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err = stream.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Every MQTT 5 field is refused on 3.1.1 with a message that names it and
// the fix; so are reserved user property names and require_subscribers with
// end_to_end, whatever the protocol.
func TestMQTT5FieldsAreRefusedAtStartWhereTheyCannotApply(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	cases := []struct {
		fields []string
		want   []string
	}{
		{[]string{"envelope", "properties"}, []string{"envelope: properties", `protocol_version: "5"`}},
		{[]string{"user_properties", "{ site: a }"}, []string{"user_properties", `protocol_version: "5"`}},
		{[]string{"content_type", "text/plain"}, []string{"content_type", `protocol_version: "5"`}},
		{[]string{"message_expiry", "1h"}, []string{"message_expiry", `protocol_version: "5"`}},
		{[]string{"require_subscribers", "true"}, []string{"require_subscribers", `protocol_version: "5"`}},
		{[]string{"user_properties", "{ event_id: x }", "protocol_version", `"5"`}, []string{`"event_id" is reserved`}},
		{[]string{"message_expiry", "1.5s", "protocol_version", `"5"`}, []string{"whole seconds"}},
		{[]string{"require_subscribers", "true", "confirm", "end_to_end"}, []string{"require_subscribers applies to confirm: broker"}},
	}
	if err := startErr(t, outputConf(unreachable, filepath.Join(t.TempDir(), "control.db"))); err != nil {
		t.Fatalf("the same output without MQTT 5 fields did not start: %v", err)
	}
	for _, c := range cases {
		err := startErr(t, outputConf(unreachable, path, c.fields...))
		if err == nil {
			t.Errorf("%v: the output started", c.fields)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q lacks %q", c.fields, err, w)
			}
		}
	}
}

// A record keeps its MQTT 5 properties: a retried write of one event ID
// is idempotent only when they are equal too.
func TestRetriedEventIDWithOtherPropertiesConflicts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	p := streamtest.Start(t, outputConf(unreachable, path, "protocol_version", `"5"`, "envelope", "properties",
		"user_properties", `{ site: '${! meta("site") }' }`))
	for i := 0; i < 2; i++ {
		if err := p.Write(10*time.Second, "same", "n", "a", "id", "evt-7", "site", "s1"); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	err := p.Write(10*time.Second, "same", "n", "a", "id", "evt-7", "site", "s2")
	if err == nil || !strings.Contains(err.Error(), "evt-7") {
		t.Fatalf("the same event ID with another user property: got %v, want an error naming the event", err)
	}
	p.Stop()
	if left := pendingIn(t, path); left != 1 {
		t.Fatalf("outbox holds %d records, want exactly 1", left)
	}
}
