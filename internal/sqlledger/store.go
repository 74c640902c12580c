// Package sqlledger is the SQL store of the dedup ledger: a table of
// (namespace, key) rows that says which messages have had their effect, kept
// in the same database as that effect.
//
// The invariant, enforced in Apply: a ledger row exists if and only if the
// caller's statements for that key were committed with it, in one
// transaction. So a message redelivered after a crash between commit and
// acknowledgement finds its row and is skipped, and a message whose
// statements failed leaves no row and is applied when it comes back.
//
// SQLite (modernc.org/sqlite, no cgo) and PostgreSQL (pgx) share all code
// through database/sql; the differences live in dialect.go.
//
// Pool (pool.go) is the process's one handle per table: its workers (one
// groupcommit loop per connection) group concurrent requests into
// transactions, and its claims (internal/claims, the key type and claim
// table the bbolt ledger uses too) stop two local copies of a key from
// passing at once. check.go refuses a configuration the pool could not
// honour; statements.go finds transaction control in configured statements.
// batch.go runs a group in one transaction (pgbatch.go: PostgreSQL's, in two
// round trips). dialect.go tells an unavailable server (retried until one
// answers: a failover) from a refusal.
// What dedup_ledger decides for a copy is internal/dedup.
package sqlledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledgerclock"
)

// Config says which database to use and how hard to retry.
// Zero values take the defaults documented on each field.
type Config struct {
	Driver Driver
	// DSN: for SQLite a file path (or file: URI); for PostgreSQL a
	// postgres:// URL or key=value string as pgx understands it.
	DSN string
	// Table is the ledger table, created if missing. Lower-case letters,
	// digits and underscores.
	Table string

	// MaxOpenConns: 0 means 1 for SQLite (one writer at a time anyway; a
	// queue in Go is faster and fairer than the busy handler's sleeps) and
	// 2 for PostgreSQL. A Pool runs one group transaction at a time per
	// connection but one (at least one: the other serves look-ups and
	// expiry), so PostgreSQL's default runs one: the messages that arrive
	// while a group commits form the next group. More parallel
	// transactions only split the same messages into smaller groups, each
	// paying its own round trips and WAL flush (and on a hot row they
	// queue for its lock anyway).
	MaxOpenConns int
	// MaxIdleConns: 0 means MaxOpenConns.
	MaxIdleConns int
	// ConnMaxLifetime: 0 means connections are reused forever.
	ConnMaxLifetime time.Duration
	// ConnectTimeout bounds Open's first connection; 0 means 10 s.
	ConnectTimeout time.Duration
	// TxTimeout bounds one attempt of a transaction; 0 means 30 s.
	TxTimeout time.Duration
	// BusyTimeout (SQLite only) is how long a connection waits for another
	// process's lock before SQLITE_BUSY; 0 means 5 s.
	BusyTimeout time.Duration

	// RetryInitial and RetryMax bound the backoff between attempts of a
	// transaction that failed with a serialization failure, a deadlock or
	// SQLITE_BUSY/LOCKED; 0 means 10 ms and 1 s. MaxRetries is how many
	// times it is tried again; 0 means 10, a negative value means never.
	RetryInitial, RetryMax time.Duration
	MaxRetries             int

	// Logf, if set, receives what the store waits for: a server that went
	// away, a standby not yet promoted.
	Logf func(format string, args ...any)
	// OnRetry, if set, is told of every transaction run again, and
	// whether because no read-write server answered (else a conflict).
	OnRetry func(unavailable bool)
	// OnAvailable, if set, is told when transactions start waiting for a
	// read-write server (false) and when one answers again (true).
	OnAvailable func(bool)
	// Clock is where the ledger clock reads time (clock.go); the zero
	// value is the system's. For tests.
	Clock ledgerclock.Source
}

// Exec is one caller statement run inside the ledger transaction, with
// driver-native placeholders ($1 for PostgreSQL, ? for SQLite).
type Exec struct {
	Query string
	Args  []any
}

// Result of Apply.
type Result struct {
	// Inserted is true when this call created the ledger row and so its
	// statements were committed; false means the key was already there and
	// nothing was run.
	Inserted bool
	// ExistingHash is the stored content hash when Inserted is false, for
	// the caller to tell a duplicate from a conflicting reuse of the key.
	ExistingHash []byte
	// Attempts is how many times the transaction ran (1 without retries).
	Attempts int
}

// Store is a ledger table in one database. Safe for concurrent use.
type Store struct {
	db    *sql.DB
	d     *dialect
	cfg   Config
	table string // quoted

	where string // the driver and the redacted DSN, for messages

	clockTable string             // quoted; the ledger clock's row (clock.go)
	clock      *ledgerclock.Clock // this process's reading; nil when opened to inspect

	waiting     atomic.Bool  // a transaction is waiting for the server
	lastDownLog atomic.Int64 // retry.go's noteDown: when the last such line went out

	insertSQL, lookupSQL, countSQL, expireSQL string
	pgInsertSQL, pgInsertNewSQL, pgLookupSQL  string // PostgreSQL's ApplyBatch
	// pgKeysSeen: the last PostgreSQL group found a key present, so the
	// next one takes two round trips (pgbatch.go).
	pgKeysSeen atomic.Bool
}

func (c *Config) setDefaults() {
	if d, ok := dialects[c.Driver]; ok && c.MaxOpenConns == 0 {
		c.MaxOpenConns = d.openConns
	}
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = c.MaxOpenConns
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 10 * time.Second
	}
	if c.TxTimeout == 0 {
		c.TxTimeout = 30 * time.Second
	}
	if c.BusyTimeout == 0 {
		c.BusyTimeout = 5 * time.Second
	}
	if c.RetryInitial == 0 {
		c.RetryInitial = 10 * time.Millisecond
	}
	if c.RetryMax == 0 {
		c.RetryMax = time.Second
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = 10
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0
	}
}

// Open connects, checks that the database answers, and creates the ledger
// table, its applied_at index and its clock's table if missing, and starts
// the clock (clock.go). An existing table must have the ledger's columns.
func Open(ctx context.Context, c Config) (*Store, error) { return connect(ctx, c, true) }

// connect connects; with create it creates the table and index if missing,
// without it only checks that the table is a ledger table.
func connect(ctx context.Context, c Config, create bool) (*Store, error) {
	if err := checkTable(c.Table); err != nil {
		return nil, fmt.Errorf("sqlledger: %w", err)
	}
	c.setDefaults()
	db, where, err := OpenDB(c, create)
	if err != nil {
		return nil, fmt.Errorf("sqlledger: %w; check sql.dsn", err)
	}
	d := dialects[c.Driver]
	db.SetMaxOpenConns(c.MaxOpenConns)
	db.SetMaxIdleConns(c.MaxIdleConns)
	db.SetConnMaxLifetime(c.ConnMaxLifetime)

	s := &Store{db: db, d: d, cfg: c, table: quoteIdent(c.Table), clockTable: quoteIdent(c.Table + "_clock"), where: where}
	s.insertSQL = fmt.Sprintf(d.sql(commonInsert), s.table, s.clockTable)
	s.lookupSQL = fmt.Sprintf(d.sql(commonLookup), s.table)
	s.countSQL = fmt.Sprintf(commonCount, s.table)
	s.expireSQL = fmt.Sprintf(d.sql(commonExpire), s.table)
	s.pgInsertSQL = fmt.Sprintf(pgInsertMany, s.table, s.clockTable)
	s.pgInsertNewSQL = fmt.Sprintf(pgInsertNew, s.table, s.clockTable)
	s.pgLookupSQL = fmt.Sprintf(pgLookupMany, s.table)

	cctx, cancel := context.WithTimeout(ctx, c.ConnectTimeout)
	defer cancel()
	if err := db.PingContext(cctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlledger: connect to %s: %w; check sql.dsn and that the database is reachable", where, err)
	}
	check := s.createSchema
	if !create {
		check = func(ctx context.Context) error {
			if err := s.checkFormat(ctx, false); err != nil {
				return err
			}
			return s.checkColumns(ctx)
		}
	}
	if err := check(cctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlledger: %s: %w", where, err)
	}
	return s, nil
}

// setupAttempts bounds ExecSetup's tries.
const setupAttempts = 3

// ExecSetup runs one setup statement (e.g. CREATE TABLE IF NOT EXISTS) on
// its own, outside any transaction. Two processes creating the same object
// at once can collide in PostgreSQL's catalog (unique violation) even with
// IF NOT EXISTS; the next try sees the object and does nothing. So a
// failing statement is tried up to setupAttempts times, and the last error
// is returned.
func (s *Store) ExecSetup(ctx context.Context, q string) error {
	var err error
	for range setupAttempts {
		if _, err = s.db.ExecContext(ctx, q); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

func (s *Store) createSchema(ctx context.Context) error {
	if err := s.markFormat(ctx); err != nil {
		return err
	}
	create := func(q string) error { return s.ExecSetup(ctx, q) }
	if err := create(fmt.Sprintf(s.d.sql(commonCreate), s.table)); err != nil {
		return fmt.Errorf("create ledger table %s: %w", s.cfg.Table, err)
	}
	if err := s.checkColumns(ctx); err != nil {
		return err
	}
	if err := create(fmt.Sprintf(commonIndex, quoteIdent(s.cfg.Table+"_applied_at"), s.table)); err != nil {
		return fmt.Errorf("create index on %s(applied_at): %w", s.cfg.Table, err)
	}
	if err := create(fmt.Sprintf(s.d.sql(commonClockCreate), s.clockTable)); err != nil {
		return fmt.Errorf("create the ledger clock's table %s_clock: %w", s.cfg.Table, err)
	}
	return s.startClock(ctx)
}

// checkColumns makes sure a table that already existed is a ledger table.
// It compares column names rather than selecting them, because SQLite
// reads a double-quoted name of a missing column as a string literal.
func (s *Store) checkColumns(ctx context.Context) error {
	rows, err := s.db.QueryContext(ctx, "SELECT * FROM "+s.table+" WHERE 1 = 0")
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", s.cfg.Table, err)
	}
	cols, err := rows.Columns()
	rows.Close()
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", s.cfg.Table, err)
	}
	have := map[string]bool{}
	for _, c := range cols {
		have[strings.ToLower(c)] = true
	}
	for _, want := range ledgerColumns {
		if !have[want] {
			return fmt.Errorf("table %s exists but is not a ledger table (it has columns %v, want %v); choose another sql.table", s.cfg.Table, cols, ledgerColumns)
		}
	}
	return nil
}

var ledgerColumns = []string{"namespace", "key", "hash", "applied_at"}

// Table returns the ledger table's name.
func (s *Store) Table() string { return s.cfg.Table }

// Close closes the connection pool.
func (s *Store) Close() error { return s.db.Close() }

// StmtError says which caller statement failed. The transaction was rolled
// back: neither the ledger row nor any statement's effect was committed.
type StmtError struct {
	Index int    // position in the stmts passed to Apply, from 0
	Query string // the statement's text
	Err   error  // the database's error
}

func (e *StmtError) Error() string {
	q := e.Query
	if len(q) > 80 {
		q = q[:80] + "…"
	}
	return fmt.Sprintf("statement %d (%q) failed: %v", e.Index, q, e.Err)
}

func (e *StmtError) Unwrap() error { return e.Err }

// Apply records k in the ledger and, only if that created the row, runs
// stmts in order, all in ONE transaction, then commits. When Apply returns
// nil with Inserted true the effect is durable and the message may be
// acknowledged; with Inserted false the key was already applied and no
// statement ran.
//
// A serialization failure, deadlock or SQLITE_BUSY/LOCKED reruns the whole
// transaction with backoff, up to MaxRetries times or until ctx ends. Any
// other error rolls everything back and is returned (a *StmtError if a
// caller statement failed); nothing was committed.
//
// A commit whose outcome is unknown (the connection died during COMMIT)
// returns an error; calling Apply again is safe, because the ledger row
// makes the retry report Inserted false if the first commit did land.
func (s *Store) Apply(ctx context.Context, k claims.Key, hash []byte, stmts []Exec) (Result, error) {
	var res Result
	var attempts int
	err := s.retry(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res = Result{}
		var err error
		res.Inserted, err = s.insert(ctx, tx, k, hash)
		if err != nil {
			return err
		}
		if !res.Inserted {
			res.ExistingHash, _, err = s.lookup(ctx, tx, k)
			return err
		}
		return runStmts(ctx, tx, stmts)
	}, &attempts)
	res.Attempts = attempts
	if err != nil {
		return Result{Attempts: attempts}, fmt.Errorf("sqlledger: apply %s to table %s: %w; %s", k, s.cfg.Table, err, outcome(err))
	}
	return res, nil
}

func runStmts(ctx context.Context, tx *sql.Tx, stmts []Exec) error {
	for i, st := range stmts {
		if _, err := tx.ExecContext(ctx, st.Query, st.Args...); err != nil {
			return &StmtError{Index: i, Query: st.Query, Err: err}
		}
	}
	return nil
}

// insert adds the ledger row if absent and reports whether it did.
// ON CONFLICT DO NOTHING on the primary key: under PostgreSQL's READ
// COMMITTED a concurrent insert of the same key waits for the other
// transaction and then skips (or inserts, if that one rolled back); SQLite
// serializes writers outright.
func (s *Store) insert(ctx context.Context, tx *sql.Tx, k claims.Key, hash []byte) (bool, error) {
	r, err := tx.ExecContext(ctx, s.insertSQL, k.Namespace, k.ID, hash)
	if err != nil {
		return false, fmt.Errorf("insert ledger row: %w", err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("insert ledger row: rows affected: %w", err)
	}
	return n == 1, nil
}

type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (s *Store) lookup(ctx context.Context, q queryer, k claims.Key) ([]byte, bool, error) {
	var hash []byte
	err := q.QueryRowContext(ctx, s.lookupSQL, k.Namespace, k.ID).Scan(&hash)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("look up ledger row: %w", err)
	}
	return hash, true, nil
}

// Lookup returns the stored hash of k and whether k is in the ledger.
func (s *Store) Lookup(ctx context.Context, k claims.Key) (hash []byte, found bool, err error) {
	hash, found, err = s.lookup(ctx, s.db, k)
	if err != nil {
		return nil, false, fmt.Errorf("sqlledger: %s in table %s: %w", k, s.cfg.Table, err)
	}
	return hash, found, nil
}

// Record inserts many keys in ONE transaction (group commit for callers
// whose effect happened elsewhere) and reports which were new. It is
// idempotent: a key already present, or repeated in keys, reports false
// and keeps its first hash. hashes may be nil; otherwise it has one entry
// per key.
func (s *Store) Record(ctx context.Context, keys []claims.Key, hashes [][]byte) (inserted []bool, err error) {
	if hashes != nil && len(hashes) != len(keys) {
		return nil, fmt.Errorf("sqlledger: record: %d keys but %d hashes", len(keys), len(hashes))
	}
	if len(keys) == 0 {
		return nil, nil
	}
	inserted = make([]bool, len(keys))
	err = s.retry(ctx, func(ctx context.Context, tx *sql.Tx) error {
		for i, k := range keys {
			var h []byte
			if hashes != nil {
				h = hashes[i]
			}
			ok, err := s.insert(ctx, tx, k, h)
			if err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			inserted[i] = ok
		}
		return nil
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("sqlledger: record %d keys in table %s: %w; %s", len(keys), s.cfg.Table, err, outcome(err))
	}
	return inserted, nil
}

// DefaultExpireLimit is the batch size Expire uses for a limit <= 0.
const DefaultExpireLimit = 1000

// Expire deletes at most limit rows applied before olderThan, oldest first,
// and returns how many it deleted. Call it until it returns fewer than
// limit; small batches keep each transaction, and its locks, short.
func (s *Store) Expire(ctx context.Context, olderThan time.Time, limit int) (removed int, err error) {
	if limit <= 0 {
		limit = DefaultExpireLimit
	}
	var n int64
	err = s.retry(ctx, func(ctx context.Context, tx *sql.Tx) error {
		r, err := tx.ExecContext(ctx, s.expireSQL, s.d.timeArg(olderThan), limit)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	}, nil)
	if err != nil {
		return 0, fmt.Errorf("sqlledger: expire rows older than %s from table %s: %w", olderThan.Format(time.RFC3339), s.cfg.Table, err)
	}
	return int(n), nil
}

// Count returns the number of ledger rows.
func (s *Store) Count(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, s.countSQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("sqlledger: count rows of table %s: %w", s.cfg.Table, err)
	}
	return n, nil
}

// DB returns the pool, for callers and tests that read the effect tables.
func (s *Store) DB() *sql.DB { return s.db }
