// Package sqlquery is the sql_query processor: it runs one SQL statement
// per message against SQLite or PostgreSQL and, when the statement returns
// rows, replaces the message with them. Benthos's core bundles have no SQL
// component; this one exists so that a pipeline can read back what a
// dedup_ledger's `apply` statements wrote (the quickstart's report) and
// keep small counters beside it.
package sqlquery

import (
	"context"
	"fmt"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlargs"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlrows"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/conffield"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/sqlconf"
)

func processorSpec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Beta().
		Categories("Integration").
		Summary("Runs one SQL statement per message; a statement that returns rows replaces the message with them as a JSON array of objects.").
		Description(`
Each message runs `+"`query`"+` once, in its own implicit transaction, with the arguments its `+"`args_mapping`"+` returns. If the statement returns columns (a `+"`SELECT`"+`, or `+"`RETURNING`"+`), the message becomes a JSON array with one object per row, keyed by column name; otherwise the message is unchanged. The whole result is held in memory: bound it (`+"`LIMIT`"+`). A failing statement flags the message with the database's error.

This is not part of the delivery guarantee: the statement commits on its own, not with the ledger. For an effect that must happen exactly once, use `+"`dedup_ledger`"+`'s `+"`sql.apply`"+`, which commits the statements with the ledger row; use this processor to read back what they wrote, or for counters where a repeat after a crash does not matter.

A database is opened as `+"`dedup_ledger`"+` opens it: a SQLite file gets WAL, `+"`synchronous=FULL`"+` and a 5 s busy timeout unless the DSN sets them, so a reader waits while a `+"`dedup_ledger`"+` of the same file commits.`).
		Fields(
			sqlconf.DriverField(),
			service.NewStringField(sqlconf.FieldDSN).
				Description("The SQLite file path, or a PostgreSQL URL.").
				Example("./data/consumer.db").Example("postgres://user:pass@127.0.0.1:5432/app"),
			service.NewStringListField(sqlconf.FieldInit).
				Description("Statements run once at start, e.g. `CREATE TABLE IF NOT EXISTS`.").
				Default([]any{}),
			service.NewStringField(sqlconf.FieldQuery).
				Description("The statement; `?` placeholders for SQLite, `$1`… for PostgreSQL.").
				Example("SELECT run_id, COUNT(*) AS applied FROM readings GROUP BY run_id"),
			service.NewBloblangField(sqlconf.FieldArgs).
				Description("A mapping returning the array of arguments for the placeholders.").
				Optional().
				Example(`root = [ this.run_id ]`),
		).
		Example("Read back a table", "Every 5 s, count rows per run and log them.", `
input:
  generate:
    interval: 5s
    mapping: root = {}
pipeline:
  processors:
    - sql_query:
        dsn: ./data/consumer.db
        query: SELECT run_id, COUNT(*) AS applied FROM readings GROUP BY run_id
    - unarchive: { format: json_array }
    - log:
        message: 'run ${! this.run_id }: ${! this.applied } applied'
output:
  drop: {}
`)
}

func init() {
	err := service.RegisterBatchProcessor("sql_query", processorSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchProcessor, error) {
			return newProcessor(conf)
		})
	if err != nil {
		panic(err)
	}
}

type processor struct {
	db *sqlrows.DB
	st sqlconf.Statement
}

func newProcessor(conf *service.ParsedConfig) (*processor, error) {
	p := &processor{}
	var driver, dsn string
	var inits []string
	err := conffield.Read(conf, conffield.String(&driver, sqlconf.FieldDriver), conffield.String(&dsn, sqlconf.FieldDSN),
		conffield.StringList(&inits, sqlconf.FieldInit))
	if err != nil {
		return nil, err
	}
	if p.st, err = sqlconf.ReadStatement(conf); err != nil {
		return nil, err
	}
	if p.db, err = sqlrows.Open(driver, dsn, inits); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *processor) ProcessBatch(ctx context.Context, batch service.MessageBatch) ([]service.MessageBatch, error) {
	args := sqlargs.For(batch, p.st.Args)
	for i, msg := range batch {
		if err := p.run(ctx, msg, args, i); err != nil {
			msg.SetError(fmt.Errorf("sql_query: %s: %w", p.db.Where, err))
		}
	}
	return []service.MessageBatch{batch}, nil
}

// run queries for message i (msg); argsExec evaluates its arguments.
func (p *processor) run(ctx context.Context, msg *service.Message, argsExec *service.MessageBatchBloblangExecutor, i int) error {
	var args []any
	if argsExec != nil {
		var err error
		if args, err = sqlargs.Of(argsExec, i); err != nil {
			return fmt.Errorf("args_mapping: %w", err)
		}
	}
	rows, ok, err := p.db.Query(ctx, p.st.Query, args)
	if ok {
		msg.SetStructuredMut(rows)
	}
	return err
}

func (p *processor) Close(context.Context) error { return p.db.Close() }
