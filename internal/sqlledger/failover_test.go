package sqlledger

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// What IsUnavailable calls "no read-write server" (retry on a later
// connection) and what it calls a refusal no retry fixes.
func TestUnavailableClassification(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Code: code} }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true},
		{"conn closed mid-commit", &commitError{pgconn.ErrConnClosed}, true},
		{"unexpected EOF in a statement", &StmtError{Err: io.ErrUnexpectedEOF}, true},
		{"a standby (read-only connection)", fmt.Errorf("ValidateConnect failed: %w", pgconn.ErrReadOnlyConnection), true},
		{"admin shutdown", pg("57P01"), true},
		{"starting up", pg("57P03"), true},
		{"read-only transaction", pg("25006"), true},
		{"one host refused, the other a standby", errors.Join(syscall.ECONNREFUSED, pgconn.ErrReadOnlyConnection), true},
		{"wrong password", pg("28P01"), false},
		{"refused host, then a wrong password", errors.Join(syscall.ECONNREFUSED, pg("28P01")), false},
		{"missing database", pg("3D000"), false},
		{"missing table in a statement", &StmtError{Err: pg("42P01")}, false},
		{"unique violation", pg("23505"), false},
		{"serialization failure (a conflict, not an outage)", pg("40001"), false},
		{"bad DSN", &permanentError{errors.New("cannot parse")}, false},
	} {
		if got := postgresUnavailable(tc.err); got != tc.want {
			t.Errorf("%s (%v): unavailable = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// proxied is a fresh database of pg reached through a proxy the test can
// cut or stall, and its DSN.
func proxied(t *testing.T, pg *harness.Postgres) (*harness.Proxy, string) {
	direct := fmt.Sprintf("127.0.0.1:%d", pg.Port())
	proxy := harness.NewProxy(t, direct)
	return proxy, strings.Replace(pg.NewDatabase(t), direct, proxy.Addr(), 1)
}

// logLines collects a store's log lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logf(f string, a ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(f, a...))
	l.mu.Unlock()
}

func (l *logLines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(strings.Join(l.lines, "\n"), s)
}

// outcomesWithin waits for ApplyAll's outcomes on done.
func outcomesWithin(t *testing.T, done <-chan []Outcome, d time.Duration) []Outcome {
	t.Helper()
	select {
	case outs := <-done:
		return outs
	case <-time.After(d):
		t.Fatalf("ApplyAll did not finish within %s of the server answering again", d)
		return nil
	}
}

// A pool opened while no server answers waits for one, logging what it
// waits for, instead of failing; once the pool runs, a transaction whose
// server went away waits for it too and then commits, whole, once.
func TestPoolWaitsForTheServerAtStartAndWhileRunning(t *testing.T) {
	pg := harness.StartPostgres(t)
	proxy, dsn := proxied(t, pg)
	proxy.Cut()
	var log logLines
	logged := log.has
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pc := PoolConfig{
		Config:   Config{Driver: Postgres, DSN: dsn, Table: "ledger", ConnectTimeout: 2 * time.Second, RetryInitial: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond, MaxRetries: 2},
		Init:     []string{`CREATE TABLE IF NOT EXISTS counter (value INTEGER NOT NULL)`, `INSERT INTO counter SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM counter)`},
		MaxBatch: 8, Logf: log.logf,
	}
	opened := make(chan error, 1)
	var pool *Pool
	go func() {
		var err error
		pool, err = OpenPool(ctx, pc)
		opened <- err
	}()
	harness.Eventually(t, 20*time.Second, "a log line saying the pool waits for a server", func() bool {
		return logged("waiting for a read-write server")
	})
	select {
	case err := <-opened:
		t.Fatalf("OpenPool returned while no server answered: %v", err)
	default:
	}
	proxy.Restore()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatalf("OpenPool after the server came back: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("OpenPool did not return within 30s of the server answering")
	}
	defer pool.Release()

	// Running: the server goes away (every connection closed, new ones
	// refused) while two messages are submitted.
	proxy.Cut()
	b := postgresBackend(pg)
	entries := []Entry{
		{Key: claims.Key{Namespace: "n", ID: "e1"}, Hash: []byte("h1"), Stmts: []Exec{incr(b, 1)}},
		{Key: claims.Key{Namespace: "n", ID: "e2"}, Hash: []byte("h2"), Stmts: []Exec{incr(b, 10)}},
	}
	done := make(chan []Outcome, 1)
	go func() { done <- pool.ApplyAll(ctx, entries) }()
	harness.Eventually(t, 20*time.Second, "a log line saying transactions wait for the server", func() bool {
		return logged("has no read-write server answering")
	})
	select {
	case outs := <-done:
		t.Fatalf("ApplyAll returned while the server was away: %+v", outs)
	case <-time.After(time.Second): // more than MaxRetries' worth of backoff
	}
	proxy.Restore()
	outs := outcomesWithin(t, done, 30*time.Second)
	for i, o := range outs {
		if o.Err != nil || !o.Inserted {
			t.Fatalf("entry %d after the outage: %+v", i, o)
		}
	}
	var v, rows int
	if err := pool.Store().DB().QueryRowContext(ctx, `SELECT (SELECT value FROM counter), (SELECT COUNT(*) FROM ledger)`).Scan(&v, &rows); err != nil {
		t.Fatal(err)
	}
	if v != 11 || rows != 2 {
		t.Fatalf("counter = %d, ledger rows = %d; want 11 and 2", v, rows)
	}
	if !logged("answers again") {
		t.Errorf("no log line saying the server answers again: %q", log.lines)
	}
}

// Errors no wait fixes end OpenPool at once, whatever StartupWait says.
func TestPoolStopsAtOnceOnPermanentErrors(t *testing.T) {
	pg := harness.StartPostgres(t)
	missing := strings.Replace(pg.DSN(), "/harness?", "/no_such_database?", 1)
	for _, tc := range []struct{ name, dsn, want string }{
		{"missing database", missing, "does not exist"},
		{"DSN pgx cannot parse", "postgres://u@127.0.0.1:notaport/db", "sql.dsn"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		_, err := OpenPool(ctx, PoolConfig{Config: Config{Driver: Postgres, DSN: tc.dsn, Table: "ledger"}, MaxBatch: 1})
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want an error containing %q, got %v", tc.name, tc.want, err)
		}
		if err != nil && strings.Contains(err.Error(), "gave up waiting") {
			t.Errorf("%s: a permanent error was retried until the context ended: %v", tc.name, err)
		}
	}
}

// A server that stops answering without closing the connection (a dead
// machine, a partition: here a proxy that holds every byte) does not hold
// a transaction for good: each attempt ends after TxTimeout and is run
// again; once the server answers, the messages apply exactly once (if the
// abandoned attempt's COMMIT reaches the server after all, the retry finds
// its rows).
func TestTransactionOnASilentServerIsAbandonedAndRetried(t *testing.T) {
	pg := harness.StartPostgres(t)
	proxy, dsn := proxied(t, pg)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var log logLines
	pool, err := OpenPool(ctx, PoolConfig{
		Config: Config{Driver: Postgres, DSN: dsn, Table: "ledger", ConnectTimeout: time.Second, TxTimeout: time.Second,
			RetryInitial: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond, MaxRetries: 2},
		Init:     []string{`CREATE TABLE counter (value INTEGER NOT NULL)`, `INSERT INTO counter VALUES (0)`},
		MaxBatch: 8,
		Logf:     log.logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Release()

	proxy.Stall()
	b := postgresBackend(pg)
	entries := []Entry{
		{Key: claims.Key{Namespace: "n", ID: "e1"}, Stmts: []Exec{incr(b, 1)}},
		{Key: claims.Key{Namespace: "n", ID: "e2"}, Stmts: []Exec{incr(b, 10)}},
	}
	done := make(chan []Outcome, 1)
	go func() { done <- pool.ApplyAll(ctx, entries) }()
	harness.Eventually(t, 30*time.Second, "the stalled transaction to be abandoned and retried", func() bool {
		return log.has("has no read-write server answering")
	})
	proxy.Restore()
	outs := outcomesWithin(t, done, 60*time.Second)
	for i, o := range outs {
		if o.Err != nil {
			t.Fatalf("entry %d: %v", i, o.Err)
		}
	}
	var v, rows int
	if err := pool.Store().DB().QueryRowContext(ctx, `SELECT (SELECT value FROM counter), (SELECT COUNT(*) FROM ledger)`).Scan(&v, &rows); err != nil {
		t.Fatal(err)
	}
	if v != 11 || rows != 2 {
		t.Fatalf("counter = %d, ledger rows = %d; want 11 and 2", v, rows)
	}
	t.Logf("log: %q", log.lines)
}
