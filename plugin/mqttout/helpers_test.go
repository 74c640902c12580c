package mqttout_test

import (
	"testing"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttout"
)

// pendingIn opens an outbox file (not in use) and returns its pending count.
func pendingIn(t *testing.T, path string) int {
	t.Helper()
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatalf("reopen outbox: %v", err)
	}
	defer ob.Close()
	return ob.Stats().Pending
}
