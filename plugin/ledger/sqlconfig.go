package ledger

import (
	"fmt"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/conffield"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/sqlconf"
)

// sqlField declares the sql object: the SQL store instead of a bbolt file.
func sqlField() *service.ConfigField {
	return service.NewObjectField(fieldSQL,
		sqlconf.DriverField(),
		service.NewStringField(sqlconf.FieldDSN).
			Description("For SQLite the database file (WAL, `synchronous=FULL` and a busy timeout are added unless the DSN sets them). For PostgreSQL a `postgres://` URL or `key=value` string; with a primary and standbys, list every host and set `target_session_attrs=read-write`, so that each new connection finds the current primary (see docs/scaling.md for what a failover does). Passwords are redacted in errors and logs.").
			Example("./data/ledger.db").
			Example("postgres://app:secret@db.internal:5432/app?sslmode=verify-full").
			Example("postgres://app:secret@db1:5432,db2:5432/app?target_session_attrs=read-write&sslmode=verify-full"),
		service.NewStringField(fieldSQLTable).
			Description("The ledger table, created if missing: primary key (`namespace`, `key`), the payload's SHA-256 `hash` and `applied_at`. Lower-case letters, digits and underscores.").
			Default("dedup_ledger"),
		service.NewStringListField(sqlconf.FieldInit).
			Description("Statements run once, in order, when the processor starts (outside any message's transaction), e.g. `CREATE TABLE IF NOT EXISTS` for the tables `apply` writes. A failing statement stops the pipeline from starting.").
			Default([]any{}),
		service.NewObjectListField(fieldSQLApply,
			service.NewStringField(sqlconf.FieldQuery).
				Description("The statement, with the driver's placeholders: `?` for SQLite, `$1`, `$2`, … for PostgreSQL. Transaction control (`BEGIN`, `COMMIT`, `ROLLBACK`, `SAVEPOINT`, `RELEASE`, `END`, `START`, `ABORT`) is refused: the processor owns the transaction."),
			service.NewBloblangField(sqlconf.FieldArgs).
				Description("A Bloblang mapping whose result is the array of the statement's arguments. Objects and arrays as arguments are refused: encode them, e.g. `this.doc.format_json()`.").
				Example(`root = [ this.delta ]`).
				Optional(),
		).Description("The message's effect: statements run in the SAME transaction as the ledger insert, and only when that insert created the row (the key was new). The transaction commits before the message moves on. Without `apply` the key is recorded when the pipeline acknowledges the message, as with `path`.").
			Default([]any{}),
		service.NewIntField(fieldSQLMaxBatch).
			Description("At most this many messages, from all pipeline threads, share one transaction (a failing message rolls back alone: with SQLite in its own savepoint, with PostgreSQL the transaction runs again without it). Messages can only be grouped while they wait in the processor together: set `pipeline.threads` to at least the broker's in-flight window for the consumer (Mosquitto's `max_inflight_messages`, default 20).").
			Default(64).Advanced(),
		service.NewIntField(fieldSQLMaxOpen).
			Description("Maximum open connections; `0` means 1 for SQLite (one writer at a time anyway) and 2 for PostgreSQL. One fewer (at least one) is how many group transactions run at once; the other connection serves look-ups and expiry. Fewer transactions group more messages each, and a group costs its round trips and its commit whatever its size (see docs/scaling.md).").
			Default(0).Advanced(),
		service.NewIntField(fieldSQLMaxIdle).
			Description("Maximum idle connections; `0` means `max_open_conns`.").
			Default(0).Advanced(),
		service.NewDurationField(fieldSQLConnMaxLifetime).
			Description("Close connections older than this; `0s` keeps them.").
			Default("0s").Advanced(),
		service.NewDurationField(fieldSQLConnectTimeout).
			Description("How long one connection attempt may take, to each host of the DSN (unless the DSN sets `connect_timeout`).").
			Default("10s").Advanced(),
		service.NewDurationField(fieldSQLTxTimeout).
			Description("How long one attempt of a group's transaction may take. Then it is abandoned (its connection closed, which rolls it back unless COMMIT had landed; the ledger rows tell) and run again, as for a server that went away: a server that stops answering without closing the connection (a machine that died, a network partition) would otherwise hold the messages until TCP gives up, which can take hours. Keep it above your slowest `apply`.").
			Default("30s").Advanced(),
		service.NewDurationField(fieldSQLStartupWait).
			Description("How long start-up waits for a read-write server while none answers (refused, starting up, or only a standby not yet promoted), retrying with backoff and logging what it waits for; meanwhile the pipeline is not built, `/ready` does not answer 200 and no message is processed or acknowledged (the input may already hold what the broker sends it, unacknowledged). `0s` waits until a server answers or the process is stopped. Errors no wait fixes stop the start at once: a DSN pgx cannot parse, a wrong password or user, a missing database, a host name that does not resolve, a failing `init_statements` entry.").
			Default("0s").Advanced(),
		service.NewDurationField(fieldSQLBusyTimeout).
			Description("SQLite only: how long a transaction waits for another process's lock.").
			Default("5s").Advanced(),
		service.NewObjectField(fieldSQLRetry,
			service.NewDurationField(fieldSQLRetryInitial).Description("First backoff after a serialization failure, deadlock or SQLITE_BUSY.").Default("10ms"),
			service.NewDurationField(fieldSQLRetryMax).Description("The backoff doubles up to this.").Default("1s"),
			service.NewIntField(fieldSQLRetryCount).Description("How many times such a transaction is run again before the messages fail (and are redelivered later). `0` never retries.").Default(10),
		).Description("Retry of transient conflicts. Other errors fail the message at once.").Advanced(),
	).
		Description("An SQL ledger instead of a bbolt file. With `apply`, the ledger row and the message's effect commit in one database transaction: exactly-once effects in that database. Set exactly one of `path` and `sql`.").
		Optional()
}

// sqlSettings is the parsed sql object.
type sqlSettings struct {
	pool  sqlledger.PoolConfig // without retention and callbacks
	apply []sqlconf.Statement
}

// parseSQLSettings reads the sql object; sqlledger checks it.
func parseSQLSettings(conf *service.ParsedConfig) (*sqlSettings, error) {
	s := &sqlSettings{}
	c := &s.pool.Config
	var driver string
	var retries int
	err := conffield.Read(conf,
		conffield.String(&driver, sqlconf.FieldDriver), conffield.String(&c.DSN, sqlconf.FieldDSN), conffield.String(&c.Table, fieldSQLTable),
		conffield.Int(&s.pool.MaxBatch, fieldSQLMaxBatch), conffield.Int(&c.MaxOpenConns, fieldSQLMaxOpen),
		conffield.Int(&c.MaxIdleConns, fieldSQLMaxIdle), conffield.Int(&retries, fieldSQLRetry, fieldSQLRetryCount),
		conffield.Duration(&c.ConnMaxLifetime, fieldSQLConnMaxLifetime), conffield.Duration(&c.ConnectTimeout, fieldSQLConnectTimeout),
		conffield.Duration(&s.pool.StartupWait, fieldSQLStartupWait), conffield.Duration(&c.TxTimeout, fieldSQLTxTimeout),
		conffield.Duration(&c.BusyTimeout, fieldSQLBusyTimeout),
		conffield.Duration(&c.RetryInitial, fieldSQLRetry, fieldSQLRetryInitial), conffield.Duration(&c.RetryMax, fieldSQLRetry, fieldSQLRetryMax),
		conffield.StringList(&s.pool.Init, sqlconf.FieldInit))
	if err != nil {
		return nil, err
	}
	c.Driver, c.MaxRetries = sqlledger.Driver(driver), retries
	stmts, err := conf.FieldObjectList(fieldSQLApply)
	if err != nil {
		return nil, err
	}
	queries := make([]string, len(stmts))
	for i, sc := range stmts {
		st, err := sqlconf.ReadStatement(sc)
		if err != nil {
			return nil, fmt.Errorf("sql.apply[%d]: %w", i, err)
		}
		s.apply, queries[i] = append(s.apply, st), st.Query
	}
	if err := s.pool.Check(queries); err != nil {
		return nil, err
	}
	if retries == 0 {
		c.MaxRetries = -1 // sqlledger: negative means never
	}
	return s, nil
}
