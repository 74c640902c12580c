package mqttclient

import (
	"fmt"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// Backoff is a delay that starts at Initial and doubles up to Max: the
// reconnect loop, the output's resends and the input's retries share it.
type Backoff struct {
	Initial, Max time.Duration
}

// Next returns the delay that follows d.
func (b Backoff) Next(d time.Duration) time.Duration { return min(d*2, b.Max) }

// BackoffField declares an object field with `initial_interval` and
// `max_interval`. description says what the delay is between.
func BackoffField(name, description, initialDefault, maxDefault string) *service.ConfigField {
	return service.NewObjectField(name,
		service.NewDurationField("initial_interval").Description("The first delay.").Default(initialDefault),
		service.NewDurationField("max_interval").Description("The delay doubles with each consecutive failure up to this bound.").Default(maxDefault),
	).Description(description).Advanced()
}

// ParseBackoff reads a field declared with BackoffField and checks it.
func ParseBackoff(pc *service.ParsedConfig, name string) (Backoff, error) {
	var b Backoff
	var err error
	if b.Initial, err = pc.FieldDuration(name, "initial_interval"); err != nil {
		return b, err
	}
	if b.Max, err = pc.FieldDuration(name, "max_interval"); err != nil {
		return b, err
	}
	return b, b.check(name)
}

func (b Backoff) check(name string) error {
	if b.Initial <= 0 || b.Max < b.Initial {
		return fmt.Errorf("%s: initial_interval must be positive and max_interval at least initial_interval", name)
	}
	return nil
}
