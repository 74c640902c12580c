package mqttclient

import (
	"fmt"
	"time"
)

// Backoff is a delay that starts at Initial and doubles up to Max: the
// reconnect loop, the output's resends and the input's retries share it.
type Backoff struct {
	Initial, Max time.Duration
}

// Next returns the delay that follows d.
func (b Backoff) Next(d time.Duration) time.Duration { return min(d*2, b.Max) }

// Check refuses a backoff that could spin (no initial delay) or shrink;
// name is its config field, for the error.
func (b Backoff) Check(name string) error {
	if b.Initial <= 0 || b.Max < b.Initial {
		return fmt.Errorf("%s: initial_interval must be positive and max_interval at least initial_interval", name)
	}
	return nil
}
