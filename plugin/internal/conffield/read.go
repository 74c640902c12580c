package conffield

import (
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// A Field reads one field of a parsed config into its target.
type Field func(pc *service.ParsedConfig) error

// Read reads fields in order and stops at the first error: a component
// lists its plain fields once instead of one read and one error check each.
func Read(pc *service.ParsedConfig, fields ...Field) error {
	for _, f := range fields {
		if err := f(pc); err != nil {
			return err
		}
	}
	return nil
}

func into[T any](get func(*service.ParsedConfig, ...string) (T, error), to *T, path []string) Field {
	return func(pc *service.ParsedConfig) error {
		v, err := get(pc, path...)
		if err == nil {
			*to = v
		}
		return err
	}
}

// String reads the string field at path into to.
func String(to *string, path ...string) Field {
	return into((*service.ParsedConfig).FieldString, to, path)
}

// StringList reads the string list field at path into to.
func StringList(to *[]string, path ...string) Field {
	return into((*service.ParsedConfig).FieldStringList, to, path)
}

// StringMap reads the string map field at path into to.
func StringMap(to *map[string]string, path ...string) Field {
	return into((*service.ParsedConfig).FieldStringMap, to, path)
}

// Int reads the int field at path into to.
func Int(to *int, path ...string) Field { return into((*service.ParsedConfig).FieldInt, to, path) }

// Bool reads the bool field at path into to.
func Bool(to *bool, path ...string) Field { return into((*service.ParsedConfig).FieldBool, to, path) }

// FloatList reads the float list field at path into to.
func FloatList(to *[]float64, path ...string) Field {
	return into((*service.ParsedConfig).FieldFloatList, to, path)
}

// Duration reads the duration field at path into to.
func Duration(to *time.Duration, path ...string) Field {
	return into((*service.ParsedConfig).FieldDuration, to, path)
}

// Enum reads the string field name into to, refusing a value not in valid
// (FieldEnum).
func Enum(to *string, name string, valid ...string) Field {
	return func(pc *service.ParsedConfig) (err error) {
		*to, err = FieldEnum(pc, name, valid...)
		return err
	}
}

// PositiveDuration reads the duration field at path into to, refusing zero
// or less (FieldPositiveDuration).
func PositiveDuration(to *time.Duration, path ...string) Field {
	return into(func(pc *service.ParsedConfig, path ...string) (time.Duration, error) {
		return FieldPositiveDuration(pc, path...)
	}, to, path)
}
