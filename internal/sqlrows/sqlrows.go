// Package sqlrows is the engine of the sql_query processor, without
// Benthos: it opens a database of sqlledger's dialect table, checks the
// connection and runs the init statements, and runs one statement, giving
// the rows it returns as structured values (a list of column-to-value
// objects).
package sqlrows

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
)

// Timeout bounds one statement (and the connection check at start):
// Benthos hands processors contexts without deadline.
const Timeout = 10 * time.Second

// DB is an open database and what to call it in errors.
type DB struct {
	db    *sql.DB
	Where string // driver and DSN, e.g. "sqlite database ./data/x.db"
}

// Open opens the database as dedup_ledger does (sqlledger's dialect table:
// one opener, one list of drivers), creating a SQLite file's directory,
// checks the connection and runs inits in order. Its errors start with
// "sql_query: ".
func Open(driver, dsn string, inits []string) (*DB, error) {
	c := sqlledger.Config{Driver: sqlledger.Driver(driver), DSN: dsn}
	db, where, err := sqlledger.OpenDB(c, true)
	if err != nil {
		return nil, fmt.Errorf("sql_query: %w; check dsn", err)
	}
	d := &DB{db: db, Where: where}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if err := d.db.PingContext(ctx); err != nil {
		d.db.Close()
		return nil, fmt.Errorf("sql_query: connect to %s: %w; check dsn", d.Where, err)
	}
	for i, st := range inits {
		if _, err := d.db.ExecContext(ctx, st); err != nil {
			d.db.Close()
			return nil, fmt.Errorf("sql_query: %s: init_statements[%d]: %w", d.Where, i, err)
		}
	}
	return d, nil
}

// Query runs query with args, bounded by Timeout. It returns the rows as a
// list of objects (byte values as strings), and ok false when the statement
// returns no columns (the message is then left as it is).
func (d *DB) Query(ctx context.Context, query string, args []any) (rows []any, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	rs, err := d.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, false, err
	}
	defer rs.Close()
	cols, err := rs.Columns()
	if err != nil || len(cols) == 0 {
		return nil, false, err
	}
	out := []any{}
	for rs.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for k := range vals {
			ptrs[k] = &vals[k]
		}
		if err := rs.Scan(ptrs...); err != nil {
			return nil, false, err
		}
		row := make(map[string]any, len(cols))
		for k, c := range cols {
			if b, ok := vals[k].([]byte); ok {
				vals[k] = string(b)
			}
			row[c] = vals[k]
		}
		out = append(out, row)
	}
	if err := rs.Err(); err != nil {
		return nil, false, err
	}
	return out, true, nil
}

// Close closes the database.
func (d *DB) Close() error { return d.db.Close() }
