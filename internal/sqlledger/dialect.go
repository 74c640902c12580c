package sqlledger

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Driver names the database, as the components' `driver` fields do.
type Driver string

// The drivers of dialects.
const (
	SQLite   Driver = "sqlite"
	Postgres Driver = "postgres"
)

// dialect holds everything that differs between the databases: SQL text,
// placeholders, how applied_at is stored, which errors mean "try the whole
// transaction again", how a DSN is completed and opened, and how a group
// of entries is applied. Invariant: no other file of this package (nor
// sql_query's engine, internal/sqlrows) tests which driver it runs on; a
// new driver is one entry in dialects.
type dialect struct {
	name  string // as people write it, for messages
	about string // for the components' driver fields
	// The words of the common statements (sql): column types and the
	// greater of two values.
	bytesType, timeType, greatest string
	timeArg                       func(time.Time) any
	retryable                     func(error) bool
	// unavailable: the server went away or is not (yet) a read-write
	// primary; the same work may succeed on a later connection.
	unavailable func(error) bool
	// open returns the pool for dsn, as completed by prepareDSN.
	open       func(dsn string, c Config) (*sql.DB, error)
	prepareDSN func(dsn string, c Config) (string, error)
	// localFile returns the database file a DSN names, if the database is
	// a local file: its directory is created at start, and a read-only
	// tool refuses a missing file.
	localFile func(dsn string) (path string, ok bool)
	// placeholder is the n-th (from 1) statement argument.
	placeholder func(n int) string
	// appliedAtType names the applied_at column's type, for errors.
	appliedAtType string
	// openConns is the default for max_open_conns.
	openConns int
	// tryBatch runs one attempt of ApplyBatch; batchOne sends a group of
	// one entry through it too (it takes fewer round trips than Apply).
	tryBatch func(s *Store, ctx context.Context, entries []Entry, failed []bool, out []Outcome) (*stmtFailure, error)
	batchOne bool
}

// The statements every dialect runs, with {words} its sql method fills
// in: {bytes} and {time} column types, {max} the greater of two values, {1}
// {2} {3} the statement's arguments. Column names are quoted everywhere
// because "key" is a keyword in both dialects.
const (
	// %[1]s = quoted index name, %[2]s = quoted table. Expire needs it.
	commonIndex = `CREATE INDEX IF NOT EXISTS %[1]s ON %[2]s ("applied_at")`
	// applied_at is the ledger clock's reading (clock.go): %[1]s = quoted
	// table, %[2]s = quoted clock table.
	commonInsert = `INSERT INTO %[1]s ("namespace", "key", "hash", "applied_at") VALUES ({1}, {2}, {3}, (SELECT "reading" FROM %[2]s WHERE "id" = 1)) ON CONFLICT ("namespace", "key") DO NOTHING`
	commonLookup = `SELECT "hash" FROM %s WHERE "namespace" = {1} AND "key" = {2}`
	commonCount  = `SELECT COUNT(*) FROM %s`
	// Oldest first, at most limit rows, so one call never holds locks on
	// the whole table.
	commonExpire = `DELETE FROM %[1]s WHERE ("namespace", "key") IN (SELECT "namespace", "key" FROM %[1]s WHERE "applied_at" < {1} ORDER BY "applied_at" LIMIT {2})`
	// %s = quoted table.
	commonCreate = `CREATE TABLE IF NOT EXISTS %s (
	"namespace"  TEXT    NOT NULL,
	"key"        TEXT    NOT NULL,
	"hash"       {bytes},
	"applied_at" {time} NOT NULL,
	PRIMARY KEY ("namespace", "key")
)`
	// The ledger clock's row (clock.go); %s = quoted clock table.
	commonClockCreate = `CREATE TABLE IF NOT EXISTS %s (
	"id"      INTEGER PRIMARY KEY CHECK ("id" = 1),
	"reading" {time} NOT NULL,
	"floor"   {time} NOT NULL
)`
	commonClockInit    = `INSERT INTO %s ("id", "reading", "floor") VALUES (1, {1}, {1}) ON CONFLICT ("id") DO NOTHING`
	commonClockAdvance = `UPDATE %s SET "reading" = {max}("reading", {1}) WHERE "id" = 1`
	commonClockRestart = `UPDATE %s SET "reading" = {1}, "floor" = {1} WHERE "id" = 1 AND "reading" < {1}`
)

// sql is the common statement in d's words.
func (d *dialect) sql(common string) string {
	return strings.NewReplacer("{bytes}", d.bytesType, "{time}", d.timeType, "{max}", d.greatest,
		"{1}", d.placeholder(1), "{2}", d.placeholder(2), "{3}", d.placeholder(3)).Replace(common)
}

var dialects = map[Driver]*dialect{
	SQLite: {
		name:  "SQLite",
		about: "Embedded SQLite (pure Go, nothing to install). The DSN is a file path.",
		// applied_at is Unix microseconds: SQLite has no timestamp type and
		// integers compare correctly, which Expire relies on.
		bytesType: "BLOB", timeType: "INTEGER", greatest: "MAX",
		timeArg:     func(t time.Time) any { return t.UnixMicro() },
		retryable:   sqliteRetryable,
		unavailable: func(error) bool { return false }, // a local file
		open:        func(dsn string, _ Config) (*sql.DB, error) { return sql.Open("sqlite", dsn) },
		prepareDSN:  sqliteDSN,
		localFile:   sqliteFile,
		// Numbered, so that the clock's statements can name their one
		// argument more than once.
		placeholder: func(n int) string { return "?" + strconv.Itoa(n) },
		// One writer at a time anyway; a second connection would only
		// wait for the file lock.
		openConns:     1,
		appliedAtType: "integer (Unix microseconds)",
		tryBatch:      (*Store).tryBatch,
	},
	Postgres: {
		name:      "PostgreSQL",
		about:     "PostgreSQL, for a database several instances share.",
		bytesType: "BYTEA", timeType: "TIMESTAMPTZ", greatest: "GREATEST",
		timeArg:       func(t time.Time) any { return t.UTC() },
		retryable:     postgresRetryable,
		unavailable:   postgresUnavailable,
		open:          openPostgres,
		prepareDSN:    func(dsn string, _ Config) (string, error) { return dsn, nil },
		localFile:     func(string) (string, bool) { return "", false },
		placeholder:   func(n int) string { return "$" + strconv.Itoa(n) },
		openConns:     2,
		appliedAtType: "timestamptz",
		tryBatch:      (*Store).pgTry,
		batchOne:      true,
	},
}

// postgresRetryable: serialization_failure (40001) and deadlock_detected
// (40P01) abort a transaction that would succeed if run again; PostgreSQL's
// documentation tells applications to retry them.
func postgresRetryable(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return pe.Code == "40001" || pe.Code == "40P01"
}

// openPostgres parses dsn with pgx (a DSN pgx cannot parse is a permanent
// error, reported before any connection) and bounds every connection
// attempt, to each host of a multi-host DSN, by ConnectTimeout unless the
// DSN sets connect_timeout: a host that swallows packets must not hold a
// failover up for the kernel's TCP timeout.
func openPostgres(dsn string, c Config) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, &permanentError{fmt.Errorf("sql.dsn: %w", err)}
	}
	if !strings.Contains(dsn, "connect_timeout") {
		cfg.ConnectTimeout = c.ConnectTimeout
	}
	return stdlib.OpenDB(*cfg), nil
}

// permanentError marks what no retry can fix: the configuration is wrong.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// postgresUnavailable reports whether err means that no read-write server
// answered, rather than that the server refused the work: the connection
// broke or was refused, the server is shutting down or starting up, or it
// is a standby (read-only; with target_session_attrs=read-write pgx
// rejects it while connecting). The same transaction can then succeed on a
// later connection, to a restarted or promoted primary.
//
// Never unavailable: a wrong password or user (class 28), a database that
// does not exist (3D000), a host name that does not resolve, and every
// error of a statement the server ran (missing table, constraint): those
// need a human, not a retry.
func postgresUnavailable(err error) bool {
	if err == nil {
		return false
	}
	permanent, transient := false, false
	walkErrors(err, func(e error) {
		switch e := e.(type) {
		case *permanentError:
			permanent = true
		case *pgconn.PgError:
			switch {
			case strings.HasPrefix(e.Code, "28"), e.Code == "3D000":
				permanent = true
			case strings.HasPrefix(e.Code, "08"), // connection exception
				e.Code == "57P01", e.Code == "57P02", e.Code == "57P03", // shutdown, crash, starting up
				e.Code == "25006", // read-only transaction: we reached a standby
				e.Code == "53300": // too many connections
				transient = true
			}
		case *net.DNSError:
			if e.IsNotFound {
				permanent = true
			} else {
				transient = true
			}
		case *pgconn.ConnectError, net.Error:
			transient = true
		}
		for _, t := range transientErrs {
			if e == t {
				transient = true
			}
		}
		if pgconn.Timeout(e) {
			transient = true
		}
	})
	return transient && !permanent
}

// transientErrs are the sentinels of a lost or refused connection.
var transientErrs = []error{
	pgconn.ErrReadOnlyConnection, pgconn.ErrConnClosed, driver.ErrBadConn,
	io.EOF, io.ErrUnexpectedEOF, syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE,
	context.DeadlineExceeded,
}

// walkErrors calls fn for err and every error it wraps, through
// errors.Join's lists (pgx joins the errors of each host it tried).
func walkErrors(err error, fn func(error)) {
	for range 64 { // bounded: error chains are short
		if err == nil {
			return
		}
		fn(err)
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walkErrors(e, fn)
			}
			return
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		default:
			return
		}
	}
}

// sqliteRetryable: SQLITE_BUSY and SQLITE_LOCKED (and their extended codes,
// e.g. SQLITE_BUSY_SNAPSHOT) mean another connection held the lock past
// busy_timeout; nothing of this transaction was committed.
func sqliteRetryable(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	primary := se.Code() & 0xff
	return primary == sqlite3.SQLITE_BUSY || primary == sqlite3.SQLITE_LOCKED
}

// sqliteDSN adds the settings the ledger depends on unless the DSN already
// names them (the user's choice wins, and is theirs to answer for):
//   - journal_mode=WAL so readers do not block the writer;
//   - synchronous=FULL so a commit is on disk before Apply returns, which is
//     what makes acknowledging the message afterwards safe;
//   - busy_timeout so a second process waits for the lock instead of
//     failing at once;
//   - _txlock=immediate so a transaction takes the write lock at BEGIN; a
//     deferred transaction that reads first and then writes can fail with
//     SQLITE_BUSY without waiting at all.
func sqliteDSN(dsn string, c Config) (string, error) {
	if dsn == "" {
		return "", errors.New("sql.dsn is empty: give the SQLite database file path, e.g. /var/lib/reliable-mqtt/ledger.db")
	}
	path, query, _ := strings.Cut(dsn, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", fmt.Errorf("sql.dsn %q: query parameters: %w", dsn, err)
	}
	userSet := func(keys ...string) bool {
		for _, k := range keys {
			if q.Has(k) {
				return true
			}
			for _, p := range q["_pragma"] {
				if strings.HasPrefix(strings.ToLower(strings.TrimSpace(p)), k) {
					return true
				}
			}
		}
		return false
	}
	var add []string
	if !userSet("_busy_timeout", "_timeout", "busy_timeout") {
		add = append(add, "_busy_timeout="+strconv.FormatInt(c.BusyTimeout.Milliseconds(), 10))
	}
	if !userSet("_journal_mode", "_journal", "journal_mode") {
		add = append(add, "_journal_mode=WAL")
	}
	if !userSet("_synchronous", "_sync", "synchronous") {
		add = append(add, "_synchronous=FULL")
	}
	if !userSet("_txlock") {
		add = append(add, "_txlock=immediate")
	}
	if len(add) == 0 {
		return dsn, nil
	}
	if query != "" {
		add = append([]string{query}, add...)
	}
	return path + "?" + strings.Join(add, "&"), nil
}

// sqliteFile is the file of an SQLite DSN (a path or a file: URI, before
// its query); none for an in-memory database.
func sqliteFile(dsn string) (string, bool) {
	path, _, _ := strings.Cut(strings.TrimPrefix(dsn, "file:"), "?")
	return path, path != "" && !strings.HasPrefix(path, ":memory:")
}

// Drivers lists the supported drivers, in a stable order.
func Drivers() []Driver {
	ds := slices.Collect(maps.Keys(dialects))
	slices.Sort(ds)
	return ds
}

// OpenDB opens the database c names the way the ledger does: the dialect's
// DSN completion (for SQLite WAL, synchronous=FULL, a busy timeout and
// immediate transactions, unless the DSN sets them) and its way of
// connecting. It does not connect. With create the directory of a database
// that is a local file (an SQLite file) is created if missing, as the bbolt
// ledger's is, so that a fresh data directory works out of the box; without
// it nothing is created. where names the database for messages, its
// password redacted.
func OpenDB(c Config, create bool) (db *sql.DB, where string, err error) {
	d, err := lookupDialect(c.Driver)
	if err != nil {
		return nil, "", err
	}
	if path, ok := d.localFile(c.DSN); ok && create {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, "", fmt.Errorf("creating the directory of %s database %s: %w", d.name, path, err)
		}
	}
	c.setDefaults()
	dsn, err := d.prepareDSN(c.DSN, c)
	if err != nil {
		return nil, "", err
	}
	where = fmt.Sprintf("%s database %s", c.Driver, redactDSN(c.DSN))
	if db, err = d.open(dsn, c); err != nil {
		return nil, where, fmt.Errorf("open %s: %w", where, err)
	}
	return db, where, nil
}

// DriverDocs describes each driver, for a spec's annotated enum field.
func DriverDocs() map[string]string {
	docs := make(map[string]string, len(dialects))
	for drv, d := range dialects {
		docs[string(drv)] = d.about
	}
	return docs
}

// lookupDialect returns the dialect of driver, or an error naming the
// supported ones.
func lookupDialect(driver Driver) (*dialect, error) {
	if d, ok := dialects[driver]; ok {
		return d, nil
	}
	names := make([]string, 0, len(dialects))
	for _, d := range Drivers() {
		names = append(names, strconv.Quote(string(d)))
	}
	return nil, fmt.Errorf("sql.driver must be one of %s, got %q", strings.Join(names, ", "), driver)
}

var kvPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)`)

// redactDSN hides a password in a DSN so it can go into an error message
// or a log line.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" && u.Host != "" {
		dsn = u.Redacted()
	}
	return kvPassword.ReplaceAllString(dsn, "${1}xxxxx")
}

// validTable: lower-case letters, digits and underscores, starting with a
// letter or underscore. Lower case only so the quoted name we create is the
// same table an operator reaches unquoted in psql.
var validTable = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// maxTableLen leaves room for the index suffix within PostgreSQL's 63-byte
// identifier limit.
const maxTableLen = 48

func checkTable(name string) error {
	if len(name) > maxTableLen || !validTable.MatchString(name) {
		return fmt.Errorf("sql.table %q is not a valid table name: use 1 to %d lower-case letters, digits and underscores, starting with a letter or underscore", name, maxTableLen)
	}
	return nil
}

func quoteIdent(name string) string { return `"` + name + `"` }
