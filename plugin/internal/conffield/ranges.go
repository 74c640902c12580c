// Package conffield holds spec-field helpers of any component, none about
// MQTT: an enum read strictly, an int in a range, a positive duration, a
// doubling backoff. The MQTT plugins, dedup_ledger and the Prometheus
// exporter share them; it links no MQTT client.
package conffield

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// FieldIntIn reads the int field at path and refuses a value outside
// [min, max] with an error that names the field by its dotted path (use
// math.MaxInt for no upper bound). The spec's defaults are in range; this
// catches what a user wrote.
func FieldIntIn(pc *service.ParsedConfig, min, max int, path ...string) (int, error) {
	v, err := pc.FieldInt(path...)
	if err != nil {
		return 0, err
	}
	name := strings.Join(path, ".")
	switch {
	case v >= min && v <= max:
		return v, nil
	case max != math.MaxInt:
		return 0, fmt.Errorf("%s must be between %d and %d, got %d", name, min, max, v)
	case min == 0:
		return 0, fmt.Errorf("%s must not be negative, got %d", name, v)
	default:
		return 0, fmt.Errorf("%s must be at least %d, got %d", name, min, v)
	}
}

// FieldPositiveDuration reads the duration field at path and refuses zero
// or less, naming the field by its dotted path.
func FieldPositiveDuration(pc *service.ParsedConfig, path ...string) (time.Duration, error) {
	d, err := pc.FieldDuration(path...)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("%s must be positive, got %s", strings.Join(path, "."), d)
	}
	return d, nil
}

// FieldEnum reads a string field that must be one of valid. The linter
// checks enum fields too, but `--chilled` and programmatic configs skip the
// linter: a typo must not silently run as the default.
func FieldEnum(pc *service.ParsedConfig, name string, valid ...string) (string, error) {
	v, err := pc.FieldString(name)
	if err != nil {
		return "", err
	}
	if !slices.Contains(valid, v) {
		return "", fmt.Errorf("%s: %q is not one of %s", name, v, strings.Join(valid, ", "))
	}
	return v, nil
}
