// Package sqlconf is the SQL side both SQL plugins share (dedup_ledger's
// sql object and sql_query): the names of the fields that open a database
// and run a statement, the driver field, whose values are sqlledger's
// dialect table, and a configured statement as both read it.
package sqlconf

import (
	"fmt"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
)

// The fields both SQL plugins name alike.
const (
	FieldDriver = "driver"
	FieldDSN    = "dsn"
	FieldInit   = "init_statements"
	FieldQuery  = "query"
	FieldArgs   = "args_mapping"
)

// DriverField declares driver: one value per entry of the dialect table.
func DriverField() *service.ConfigField {
	return service.NewStringAnnotatedEnumField(FieldDriver, sqlledger.DriverDocs()).
		Description("The database.").Default(string(sqlledger.SQLite))
}

// Statement is a configured statement: query and its args_mapping.
type Statement struct {
	Query string
	Args  *bloblang.Executor // nil: no arguments
}

// ReadStatement reads query and the optional args_mapping of conf.
func ReadStatement(conf *service.ParsedConfig) (st Statement, err error) {
	if st.Query, err = conf.FieldString(FieldQuery); err != nil {
		return st, err
	}
	if conf.Contains(FieldArgs) {
		if st.Args, err = conf.FieldBloblang(FieldArgs); err != nil {
			return st, fmt.Errorf("%s: %w", FieldArgs, err)
		}
	}
	return st, nil
}
