// Package backoff is the one retry delay: the MQTT client's reconnects, the
// output's resends, the input's redeliveries of a rejected message and the
// SQL ledger's reruns of a transaction all wait Initial after the first
// failure, twice as long after each further one, and never longer than Max.
package backoff

import (
	"fmt"
	"time"
)

// Backoff is a delay that starts at Initial and doubles up to Max.
type Backoff struct {
	Initial, Max time.Duration
}

// After returns the delay after the n-th consecutive failure (n ≥ 1):
// Initial doubled n-1 times, at most Max.
func (b Backoff) After(n int) time.Duration {
	d := b.Initial
	// Bounded: d reaches Max after at most 63 doublings of a positive Initial.
	for i := 1; i < n && d < b.Max; i++ {
		d = min(d*2, b.Max)
	}
	return d
}

// Check refuses a backoff that could spin (no initial delay) or shrink;
// name is its config field, for the error.
func (b Backoff) Check(name string) error {
	if b.Initial <= 0 || b.Max < b.Initial {
		return fmt.Errorf("%s: initial_interval must be positive and max_interval at least initial_interval", name)
	}
	return nil
}
