package mqttin

import (
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// parseInput parses and builds an input without connecting it.
func parseInput(t *testing.T, yaml string) (*input, error) {
	t.Helper()
	conf, err := inputSpec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	return newInput(conf, service.MockResources())
}

// envelope: properties is refused on 3.1.1, at start, naming the fix.
func TestPropertiesEnvelopeNeedsMQTT5(t *testing.T) {
	_, err := parseInput(t, inputYAML("tcp://127.0.0.1:1", "c", []string{"a/#"}, "envelope: properties"))
	if err == nil || !strings.Contains(err.Error(), `protocol_version: "5"`) {
		t.Fatalf("envelope: properties on 3.1.1: %v, want an error naming protocol_version", err)
	}
	if _, err := parseInput(t, inputYAML("tcp://127.0.0.1:1", "c", []string{"a/#"}, "envelope: ingress")); err != nil {
		t.Fatalf("envelope: ingress on 3.1.1: %v", err)
	}
}

// The Receive Maximum sent in CONNECT is receive_buffer_size, capped at
// the protocol's 65535.
func TestReceiveMaximumIsTheReceiveBufferCapped(t *testing.T) {
	for size, want := range map[string]uint16{"20": 20, "1000": 1000, "65535": 65535, "100000": 65535} {
		in, err := parseInput(t, inputYAML("tcp://127.0.0.1:1", "c", []string{"a/#"}, "receive_buffer_size: "+size))
		if err != nil {
			t.Fatal(err)
		}
		if got := in.s.client.ReceiveMaximum; got != want {
			t.Errorf("receive_buffer_size %s: Receive Maximum %d, want %d", size, got, want)
		}
	}
}
