// Package sqlconf is the SQL side both SQL plugins share (dedup_ledger's
// sql object and sql_query): the names of the fields that open a database
// and run a statement, and the driver field, whose values are sqlledger's
// dialect table.
package sqlconf

import (
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
