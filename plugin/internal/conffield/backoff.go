package conffield

import (
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
)

// BackoffField declares an object field with `initial_interval` and
// `max_interval`. description says what the delay is between.
func BackoffField(name, description, initialDefault, maxDefault string) *service.ConfigField {
	return service.NewObjectField(name,
		service.NewDurationField("initial_interval").Description("The first delay.").Default(initialDefault),
		service.NewDurationField("max_interval").Description("The delay doubles with each consecutive failure up to this bound.").Default(maxDefault),
	).Description(description).Advanced()
}

// ParseBackoff reads a field declared with BackoffField and checks it.
func ParseBackoff(pc *service.ParsedConfig, name string) (backoff.Backoff, error) {
	var b backoff.Backoff
	var err error
	if b.Initial, err = pc.FieldDuration(name, "initial_interval"); err != nil {
		return b, err
	}
	if b.Max, err = pc.FieldDuration(name, "max_interval"); err != nil {
		return b, err
	}
	return b, b.Check(name)
}
