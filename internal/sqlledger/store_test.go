package sqlledger

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// backend is one database the behaviours run against.
type backend struct {
	driver Driver
	newDSN func(t testing.TB) string // a fresh, empty database
	ph     func(n int) string        // placeholder for argument n (from 1)
}

func sqliteBackend() backend {
	return backend{
		driver: SQLite,
		newDSN: func(t testing.TB) string { return filepath.Join(t.TempDir(), "ledger.db") },
		ph:     func(int) string { return "?" },
	}
}

func postgresBackend(pg *harness.Postgres) backend {
	return backend{
		driver: Postgres,
		newDSN: pg.NewDatabase,
		ph:     func(n int) string { return fmt.Sprintf("$%d", n) },
	}
}

// TestStore runs every behaviour against SQLite and PostgreSQL. One
// PostgreSQL cluster serves all subtests, each in its own database.
func TestStore(t *testing.T) {
	pg := harness.StartPostgres(t)
	backends := []backend{sqliteBackend(), postgresBackend(pg)}
	behaviours := []struct {
		name string
		fn   func(*testing.T, backend)
	}{
		{"RedeliveredEventCountsOnce", testRedeliveredEventCountsOnce},
		{"FailingStatementCommitsNothing", testFailingStatementCommitsNothing},
		{"ConcurrentDuplicatesApplyOnce", testConcurrentDuplicatesApplyOnce},
		{"RecordIsOneIdempotentTransaction", testRecordIsOneIdempotentTransaction},
		{"ExpireRemovesOldestInBoundedBatches", testExpireRemovesOldestInBoundedBatches},
		{"ExistingTableWithWrongColumnsIsRejected", testWrongColumnsRejected},
		{"ApplyBatchIsolatesFailingMessage", testApplyBatchIsolatesFailingMessage},
		{"ApplyBatchIsolatesStatementsFailingAtRunTime", testApplyBatchIsolatesRunTimeFailures},
		{"ClockStepsNeverExpireRowsEarly", testClockStepsNeverExpireRowsEarly},
		{"SharedClockRunsAtTheRateOfTime", testSharedClockRunsAtTheRateOfTime},
		{"RowsStampedByAnotherClockExpireAfterRetentionFromOpen", testRowsStampedByAnotherClockExpireAfterRetentionFromOpen},
	}
	for _, bh := range behaviours {
		t.Run(bh.name, func(t *testing.T) {
			for _, b := range backends {
				t.Run(string(b.driver), func(t *testing.T) { bh.fn(t, b) })
			}
		})
	}
	t.Run("PostgresDeadlockIsRetried", func(t *testing.T) { testPostgresDeadlockIsRetried(t, postgresBackend(pg)) })
	t.Run("UnreachablePostgresFailsFastWithRedactedDSN", testUnreachablePostgres)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// open opens a store on dsn with a counter table holding one row of 0.
func open(t testing.TB, b backend, dsn string, tweak func(*Config)) *Store {
	t.Helper()
	c := Config{Driver: b.driver, DSN: dsn, Table: "ledger"}
	if tweak != nil {
		tweak(&c)
	}
	s, err := Open(testCtx(t), c)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newStore(t testing.TB, b backend, tweak func(*Config)) *Store {
	t.Helper()
	s := open(t, b, b.newDSN(t), tweak)
	exec(t, s, `CREATE TABLE counter (value INTEGER NOT NULL)`)
	exec(t, s, `INSERT INTO counter (value) VALUES (0)`)
	return s
}

func exec(t testing.TB, s *Store, q string, args ...any) {
	t.Helper()
	if _, err := s.DB().ExecContext(testCtx(t), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func counter(t *testing.T, s *Store) int {
	t.Helper()
	var v int
	if err := s.DB().QueryRowContext(testCtx(t), `SELECT value FROM counter`).Scan(&v); err != nil {
		t.Fatalf("read counter: %v", err)
	}
	return v
}

func count(t *testing.T, s *Store) int64 {
	t.Helper()
	n, err := s.Count(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// incr is the seed's effect: add delta, not set a value.
func incr(b backend, delta int) Exec {
	return Exec{Query: "UPDATE counter SET value = value + " + b.ph(1), Args: []any{delta}}
}

// Seed 001 at the store level: the event is delivered twice (the worker
// died after the commit, before the ack); the counter ends at 1. The second
// delivery also comes after a restart (a new Store on the same database).
func testRedeliveredEventCountsOnce(t *testing.T, b backend) {
	ctx := testCtx(t)
	dsn := b.newDSN(t)
	s := open(t, b, dsn, nil)
	exec(t, s, `CREATE TABLE counter (value INTEGER NOT NULL)`)
	exec(t, s, `INSERT INTO counter (value) VALUES (0)`)
	k := claims.Key{Namespace: "sensor-demo", ID: "batch-42"}
	hash := []byte{0xde, 0xad, 0xbe, 0xef}

	r, err := s.Apply(ctx, k, hash, []Exec{incr(b, 1)})
	if err != nil || !r.Inserted {
		t.Fatalf("first delivery: %+v, %v; want Inserted", r, err)
	}
	r, err = s.Apply(ctx, k, hash, []Exec{incr(b, 1)})
	if err != nil || r.Inserted || !bytes.Equal(r.ExistingHash, hash) {
		t.Fatalf("redelivery: %+v, %v; want not Inserted with hash %x", r, err, hash)
	}
	if got := counter(t, s); got != 1 {
		t.Fatalf("counter = %d after a redelivery, want 1", got)
	}

	s.Close()
	s2 := open(t, b, dsn, nil)
	r, err = s2.Apply(ctx, k, []byte("other"), []Exec{incr(b, 1)})
	if err != nil || r.Inserted || !bytes.Equal(r.ExistingHash, hash) {
		t.Fatalf("redelivery after restart: %+v, %v; want not Inserted with the first hash", r, err)
	}
	if got, n := counter(t, s2), count(t, s2); got != 1 || n != 1 {
		t.Fatalf("after restart: counter = %d, ledger rows = %d; want 1 and 1", got, n)
	}
}

func testFailingStatementCommitsNothing(t *testing.T, b backend) {
	ctx := testCtx(t)
	s := newStore(t, b, nil)
	exec(t, s, `CREATE TABLE uniq (id INTEGER PRIMARY KEY)`)
	exec(t, s, `INSERT INTO uniq (id) VALUES (1)`)
	k := claims.Key{Namespace: "sensor-demo", ID: "batch-42"}

	bad := map[string]Exec{
		"constraint violation": {Query: "INSERT INTO uniq (id) VALUES (" + b.ph(1) + ")", Args: []any{1}},
		"syntax error":         {Query: "UPDATE counter SETT value = 5"},
		"missing table":        {Query: "UPDATE no_such_table SET value = 1"},
	}
	for name, st := range bad {
		r, err := s.Apply(ctx, k, nil, []Exec{incr(b, 1), st})
		var se *StmtError
		if !errors.As(err, &se) {
			t.Fatalf("%s: Apply = %+v, %v; want a *StmtError", name, r, err)
		}
		if se.Index != 1 || !strings.Contains(err.Error(), st.Query[:20]) || !strings.Contains(err.Error(), "statement 1") {
			t.Fatalf("%s: error does not name statement 1 and its text: %v", name, err)
		}
		if !strings.Contains(err.Error(), "sensor-demo/batch-42") || !strings.Contains(err.Error(), "nothing committed") {
			t.Fatalf("%s: error does not name the key and the outcome: %v", name, err)
		}
		if got := counter(t, s); got != 0 {
			t.Fatalf("%s: counter = %d after a failed Apply; the first statement leaked", name, got)
		}
		if _, found, err := s.Lookup(ctx, k); err != nil || found {
			t.Fatalf("%s: ledger row present (%v, %v) after a failed Apply", name, found, err)
		}
	}

	for range 2 {
		if _, err := s.Apply(ctx, k, nil, []Exec{incr(b, 1)}); err != nil {
			t.Fatalf("good Apply after failures: %v", err)
		}
	}
	if got, n := counter(t, s), count(t, s); got != 1 || n != 1 {
		t.Fatalf("counter = %d, ledger rows = %d; want 1 and 1", got, n)
	}
}

func testConcurrentDuplicatesApplyOnce(t *testing.T, b backend) {
	ctx := testCtx(t)

	t.Run("SameKey16Goroutines", func(t *testing.T) {
		s := newStore(t, b, func(c *Config) { c.MaxOpenConns = 16 })
		var inserted, retried atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range 16 {
			wg.Go(func() {
				r, err := s.Apply(ctx, claims.Key{Namespace: "sensor-demo", ID: "batch-42"}, []byte("h"), []Exec{incr(b, 1)})
				if err != nil {
					errs <- err
					return
				}
				if r.Inserted {
					inserted.Add(1)
				}
				if r.Attempts > 1 {
					retried.Add(1)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if got := counter(t, s); got != 1 || inserted.Load() != 1 {
			t.Fatalf("counter = %d, Inserted reported %d times; want 1 and 1", got, inserted.Load())
		}
		// The duplicates waited for the first insert and skipped; none
		// needed the retry loop (READ COMMITTED in PostgreSQL, the write
		// lock in SQLite).
		if retried.Load() != 0 {
			t.Fatalf("%d of 16 Apply calls needed a retry; want 0", retried.Load())
		}
	})

	t.Run("200KeysWithDuplicates8Goroutines", func(t *testing.T) {
		s := newStore(t, b, func(c *Config) { c.MaxOpenConns = 8 })
		var work []claims.Key
		for i := range 200 {
			work = append(work, claims.Key{Namespace: "p", ID: fmt.Sprint(i)})
		}
		for range 200 {
			work = append(work, work[rand.N(200)])
		}
		rand.Shuffle(len(work), func(i, j int) { work[i], work[j] = work[j], work[i] })
		var inserted atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := range 8 {
			wg.Go(func() {
				for i := g; i < len(work); i += 8 {
					r, err := s.Apply(ctx, work[i], nil, []Exec{incr(b, 1)})
					if err != nil {
						errs <- err
						return
					}
					if r.Inserted {
						inserted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if got, n := counter(t, s), count(t, s); got != 200 || n != 200 || inserted.Load() != 200 {
			t.Fatalf("counter = %d, ledger rows = %d, Inserted = %d; want 200 each", got, n, inserted.Load())
		}
	})
}

func testRecordIsOneIdempotentTransaction(t *testing.T, b backend) {
	ctx := testCtx(t)
	s := newStore(t, b, nil)
	a, bb, c := claims.Key{Namespace: "n", ID: "a"}, claims.Key{Namespace: "n", ID: "b"}, claims.Key{Namespace: "n", ID: "c"}

	got, err := s.Record(ctx, []claims.Key{a, bb, a}, [][]byte{[]byte("ha"), []byte("hb"), []byte("ha2")})
	if err != nil || fmt.Sprint(got) != "[true true false]" {
		t.Fatalf("Record(a, b, a) = %v, %v; want [true true false]", got, err)
	}
	got, err = s.Record(ctx, []claims.Key{bb, c}, nil)
	if err != nil || fmt.Sprint(got) != "[false true]" {
		t.Fatalf("Record(b, c) = %v, %v; want [false true]", got, err)
	}
	if h, found, err := s.Lookup(ctx, a); err != nil || !found || string(h) != "ha" {
		t.Fatalf("Lookup(a) = %q, %v, %v; want the first hash", h, found, err)
	}
	if h, found, err := s.Lookup(ctx, c); err != nil || !found || h != nil {
		t.Fatalf("Lookup(c) = %q, %v, %v; want found with no hash", h, found, err)
	}
	if _, found, err := s.Lookup(ctx, claims.Key{Namespace: "other", ID: "a"}); err != nil || found {
		t.Fatalf("Lookup in another namespace = %v, %v; namespaces must be separate", found, err)
	}
	if n := count(t, s); n != 3 {
		t.Fatalf("Count = %d, want 3", n)
	}
	if _, err := s.Record(ctx, []claims.Key{a}, [][]byte{}); err == nil {
		t.Fatal("Record with 1 key and 0 hashes succeeded")
	}

	// One transaction: when a later key fails, the earlier new key of
	// the same call is not left behind. PostgreSQL rejects a NUL byte in
	// TEXT; SQLite accepts it, so there a cancelled context stands in.
	bad, cctx := claims.Key{Namespace: "n", ID: "bad\x00"}, ctx
	if b.driver == SQLite {
		c, cancel := context.WithCancel(ctx)
		cancel()
		cctx = c
	}
	if _, err := s.Record(cctx, []claims.Key{{Namespace: "n", ID: "d"}, bad}, nil); err == nil {
		t.Fatal("Record with a failing key succeeded")
	}
	if n := count(t, s); n != 3 {
		t.Fatalf("Count = %d after a failed Record, want 3", n)
	}
}

func testExpireRemovesOldestInBoundedBatches(t *testing.T, b backend) {
	ctx := testCtx(t)
	s := newStore(t, b, nil)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 25 {
		setReading(t, s, t0.Add(time.Duration(i)*time.Second))
		if _, err := s.Apply(ctx, claims.Key{Namespace: "n", ID: fmt.Sprint(i)}, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Expire(ctx, t0, 10); err != nil || n != 0 {
		t.Fatalf("Expire(before everything) = %d, %v; want 0", n, err)
	}
	cut := t0.Add(10 * time.Second) // rows 0..9 are older
	var batches []int
	for range 10 {
		n, err := s.Expire(ctx, cut, 4)
		if err != nil {
			t.Fatal(err)
		}
		batches = append(batches, n)
		if n < 4 {
			break
		}
	}
	if fmt.Sprint(batches) != "[4 4 2]" {
		t.Fatalf("Expire batches = %v, want [4 4 2]", batches)
	}
	if n := count(t, s); n != 15 {
		t.Fatalf("Count = %d after expiry, want 15", n)
	}
	for i, want := range map[int]bool{0: false, 9: false, 10: true, 24: true} {
		if _, found, _ := s.Lookup(ctx, claims.Key{Namespace: "n", ID: fmt.Sprint(i)}); found != want {
			t.Fatalf("key %d found = %v after expiry, want %v", i, found, want)
		}
	}
	// An expired key is new again: that is what retention trades away.
	if r, err := s.Apply(ctx, claims.Key{Namespace: "n", ID: "0"}, nil, nil); err != nil || !r.Inserted {
		t.Fatalf("Apply of an expired key = %+v, %v; want Inserted", r, err)
	}
}

func testWrongColumnsRejected(t *testing.T, b backend) {
	dsn := b.newDSN(t)
	s := open(t, b, dsn, func(c *Config) { c.Table = "first" })
	exec(t, s, `CREATE TABLE not_ledger (id INTEGER)`)
	_, err := Open(testCtx(t), Config{Driver: b.driver, DSN: dsn, Table: "not_ledger"})
	if err == nil || !strings.Contains(err.Error(), "not a ledger table") {
		t.Fatalf("Open on a foreign table: %v; want 'not a ledger table'", err)
	}
}

func testApplyBatchIsolatesFailingMessage(t *testing.T, b backend) {
	ctx := testCtx(t)
	s := newStore(t, b, nil)
	k1, k2, k3 := claims.Key{Namespace: "n", ID: "1"}, claims.Key{Namespace: "n", ID: "2"}, claims.Key{Namespace: "n", ID: "3"}
	out, err := s.ApplyBatch(ctx, []Entry{
		{Key: k1, Hash: []byte("h1"), Stmts: []Exec{incr(b, 1)}},
		{Key: k2, Stmts: []Exec{incr(b, 100), {Query: "UPDATE no_such_table SET x = 1"}}},
		{Key: k1, Hash: []byte("h1"), Stmts: []Exec{incr(b, 1)}},
		{Key: k3, Stmts: []Exec{incr(b, 1)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var se *StmtError
	switch {
	case !out[0].Inserted || out[0].Err != nil:
		t.Fatalf("entry 0: %+v; want Inserted", out[0])
	case !errors.As(out[1].Err, &se) || se.Index != 1 || out[1].Inserted:
		t.Fatalf("entry 1: %+v; want a StmtError at statement 1", out[1])
	case out[2].Inserted || out[2].Err != nil || string(out[2].ExistingHash) != "h1":
		t.Fatalf("entry 2 (repeat of 0): %+v; want not Inserted with hash h1", out[2])
	case !out[3].Inserted || out[3].Err != nil:
		t.Fatalf("entry 3: %+v; want Inserted", out[3])
	}
	if got, n := counter(t, s), count(t, s); got != 2 || n != 2 {
		t.Fatalf("counter = %d, ledger rows = %d; want 2 and 2 (the failed message left nothing)", got, n)
	}
	if _, err := s.Apply(ctx, k2, nil, []Exec{incr(b, 100)}); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, s); got != 102 {
		t.Fatalf("counter = %d after the failed message came back, want 102", got)
	}
	// A key applied before reports its stored hash; a copy whose first
	// copy in the same batch failed is applied itself.
	k4 := claims.Key{Namespace: "n", ID: "4"}
	out, err = s.ApplyBatch(ctx, []Entry{
		{Key: k1, Hash: []byte("other"), Stmts: []Exec{incr(b, 1000)}},
		{Key: k4, Stmts: []Exec{{Query: "UPDATE no_such_table SET x = 1"}}},
		{Key: k4, Stmts: []Exec{incr(b, 10)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case out[0].Inserted || out[0].Err != nil || string(out[0].ExistingHash) != "h1":
		t.Fatalf("entry 0 (applied before): %+v; want not Inserted with hash h1", out[0])
	case out[1].Err == nil || out[1].Inserted:
		t.Fatalf("entry 1: %+v; want its statement's error", out[1])
	case !out[2].Inserted || out[2].Err != nil:
		t.Fatalf("entry 2 (copy of the failed entry 1): %+v; want Inserted", out[2])
	}
	if got, n := counter(t, s), count(t, s); got != 112 || n != 4 {
		t.Fatalf("counter = %d, ledger rows = %d; want 112 and 4", got, n)
	}
}

// Statements that prepare but fail when they run, in a group of new keys
// (PostgreSQL: the one-round-trip path) and in a group with a present key
// (the two-round-trip path): a unique violation of the message's own
// INSERT must not be taken for a present ledger key, and a NOT NULL
// violation fails its message only. A clean group after them applies.
func testApplyBatchIsolatesRunTimeFailures(t *testing.T, b backend) {
	ctx := testCtx(t)
	s := newStore(t, b, nil)
	exec(t, s, `CREATE TABLE uniq (id INTEGER PRIMARY KEY)`)
	exec(t, s, `INSERT INTO uniq (id) VALUES (1)`)
	key := func(id string) claims.Key { return claims.Key{Namespace: "n", ID: id} }
	dupRow := Exec{Query: "INSERT INTO uniq (id) VALUES (1)"}
	nullValue := Exec{Query: "UPDATE counter SET value = NULL"}
	// apply runs one group and checks each entry's outcome, then the
	// counter and the ledger rows.
	apply := func(round string, entries []Entry, want []string, counterWant int, rowsWant int64) {
		t.Helper()
		out, err := s.ApplyBatch(ctx, entries)
		if err != nil {
			t.Fatalf("%s: %v", round, err)
		}
		for i, o := range out {
			var se *StmtError
			got := "inserted"
			switch {
			case errors.As(o.Err, &se):
				got = fmt.Sprintf("stmt %d failed", se.Index)
			case o.Err != nil:
				got = "error: " + o.Err.Error()
			case !o.Inserted:
				got = "present " + string(o.ExistingHash)
			}
			if got != want[i] {
				t.Fatalf("%s, entry %d: %s; want %s", round, i, got, want[i])
			}
		}
		if got, n := counter(t, s), count(t, s); got != counterWant || n != rowsWant {
			t.Fatalf("%s: counter = %d, ledger rows = %d; want %d and %d", round, got, n, counterWant, rowsWant)
		}
	}
	apply("new keys", []Entry{
		{Key: key("1"), Hash: []byte("h1"), Stmts: []Exec{incr(b, 1)}},
		{Key: key("2"), Stmts: []Exec{incr(b, 100), dupRow}},
		{Key: key("3"), Stmts: []Exec{incr(b, 1)}},
	}, []string{"inserted", "stmt 1 failed", "inserted"}, 2, 2)
	apply("a present key", []Entry{
		{Key: key("1"), Hash: []byte("h1"), Stmts: []Exec{incr(b, 1000)}},
		{Key: key("4"), Stmts: []Exec{incr(b, 100), nullValue}},
		{Key: key("5"), Stmts: []Exec{incr(b, 1)}},
	}, []string{"present h1", "stmt 1 failed", "inserted"}, 3, 3)
	apply("new keys again", []Entry{{Key: key("6"), Stmts: []Exec{incr(b, 1)}}}, []string{"inserted"}, 4, 4)
}

// Two messages lock the same two rows in opposite orders; PostgreSQL aborts
// one with a deadlock (40P01) and Apply runs it again. Both effects land
// exactly once.
func testPostgresDeadlockIsRetried(t *testing.T, b backend) {
	ctx := testCtx(t)
	s := newStore(t, b, func(c *Config) { c.MaxOpenConns = 4 })
	exec(t, s, `CREATE TABLE pair (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)`)
	exec(t, s, `INSERT INTO pair VALUES (1, 0), (2, 0)`)
	bump := func(id int) Exec {
		return Exec{Query: `UPDATE pair SET value = value + 1 WHERE id = $1`, Args: []any{id}}
	}
	pause := Exec{Query: `SELECT pg_sleep(1)`} // longer than a new connection takes on a loaded machine

	var wg sync.WaitGroup
	results := make([]Result, 2)
	errs := make([]error, 2)
	for i, order := range [][2]int{{1, 2}, {2, 1}} {
		wg.Go(func() {
			results[i], errs[i] = s.Apply(ctx, claims.Key{Namespace: "n", ID: fmt.Sprint(i)}, nil, []Exec{bump(order[0]), pause, bump(order[1])})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Apply %d: %v", i, err)
		}
	}
	if results[0].Attempts+results[1].Attempts < 3 {
		t.Fatalf("attempts %d and %d: no deadlock was retried", results[0].Attempts, results[1].Attempts)
	}
	var v1, v2 int
	if err := s.DB().QueryRowContext(ctx, `SELECT (SELECT value FROM pair WHERE id = 1), (SELECT value FROM pair WHERE id = 2)`).Scan(&v1, &v2); err != nil {
		t.Fatal(err)
	}
	if v1 != 2 || v2 != 2 {
		t.Fatalf("pair = %d, %d; want 2, 2 (each message once)", v1, v2)
	}
}

func testUnreachablePostgres(t *testing.T) {
	port := harness.FreePort(t) // nothing listens there
	dsn := fmt.Sprintf("postgres://ledger:s3cret@127.0.0.1:%d/x?sslmode=disable", port)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err := Open(ctx, Config{Driver: Postgres, DSN: dsn, Table: "ledger", ConnectTimeout: 5 * time.Second})
	if err == nil {
		t.Fatal("Open on a closed port succeeded")
	}
	msg := err.Error()
	if strings.Contains(msg, "s3cret") || !strings.Contains(msg, "postgres") || !strings.Contains(msg, fmt.Sprint(port)) {
		t.Fatalf("error should name the driver and the DSN without its password: %v", msg)
	}
}

// SQLite without a server: another connection holds the write lock past
// busy_timeout; Apply retries until the lock goes, and with retries off it
// reports a retryable error and commits nothing.
func TestSQLiteBusyIsRetried(t *testing.T) {
	b := sqliteBackend()
	dsn := b.newDSN(t)
	short := func(c *Config) {
		c.BusyTimeout = 20 * time.Millisecond
		c.RetryInitial = 10 * time.Millisecond
		c.RetryMax = 50 * time.Millisecond
		c.MaxRetries = 200
	}
	s := open(t, b, dsn, short)
	exec(t, s, `CREATE TABLE counter (value INTEGER NOT NULL)`)
	exec(t, s, `INSERT INTO counter (value) VALUES (0)`)
	ctx := testCtx(t)

	// The other "process": a plain connection to the same file.
	other, err := sql.Open("sqlite", dsn+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	hold := func() *sql.Tx {
		tx, err := other.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tx
	}

	// Retries off: the lock wins, nothing is committed.
	noRetry := open(t, b, dsn, func(c *Config) { short(c); c.MaxRetries = -1 })
	tx := hold()
	_, err = noRetry.Apply(ctx, claims.Key{Namespace: "n", ID: "k"}, nil, []Exec{incr(b, 1)})
	if err == nil || !noRetry.IsRetryable(err) {
		t.Fatalf("Apply under a held lock without retries = %v; want a retryable busy error", err)
	}
	tx.Rollback()
	if n := count(t, s); n != 0 {
		t.Fatalf("ledger rows = %d after a busy failure, want 0", n)
	}

	// Retries on: Apply waits out the lock.
	tx = hold()
	done := make(chan struct{})
	var r Result
	go func() {
		defer close(done)
		r, err = s.Apply(ctx, claims.Key{Namespace: "n", ID: "k"}, nil, []Exec{incr(b, 1)})
	}()
	time.Sleep(time.Second) // many busy timeouts: Apply must have retried
	tx.Rollback()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("Apply did not finish after the lock was released")
	}
	if err != nil || !r.Inserted || r.Attempts < 2 {
		t.Fatalf("Apply = %+v, %v; want Inserted after at least 2 attempts", r, err)
	}
	if got := counter(t, s); got != 1 {
		t.Fatalf("counter = %d, want 1", got)
	}
}

// The durability settings the ledger depends on are in force on the
// store's connections.
func TestSQLiteConnectionSettings(t *testing.T) {
	b := sqliteBackend()
	s := open(t, b, b.newDSN(t), nil)
	ctx := testCtx(t)
	var mode string
	var syncLevel, busy int
	db := s.DB()
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&syncLevel); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&busy); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" || syncLevel != 2 || busy != 5000 {
		t.Fatalf("journal_mode=%s synchronous=%d busy_timeout=%d; want wal, 2 (FULL), 5000", mode, syncLevel, busy)
	}

	// A user's explicit setting wins over ours.
	dsn, err := sqliteDSN("x.db?_synchronous=NORMAL", Config{BusyTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(dsn, "FULL") || !strings.Contains(dsn, "_synchronous=NORMAL") || !strings.Contains(dsn, "_busy_timeout=1000") {
		t.Fatalf("sqliteDSN = %q", dsn)
	}
}

func TestOpenRejectsBadConfig(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	for _, name := range []string{"", "Ledger", "led-ger", "1abc", `x"; DROP TABLE y; --`, strings.Repeat("a", 49)} {
		_, err := Open(ctx, Config{Driver: SQLite, DSN: filepath.Join(dir, "l.db"), Table: name})
		if err == nil || !strings.Contains(err.Error(), "sql.table") {
			t.Fatalf("table %q: %v; want an error naming sql.table", name, err)
		}
	}
	if _, err := Open(ctx, Config{Driver: "mysql", DSN: "x", Table: "ledger"}); err == nil || !strings.Contains(err.Error(), "mysql") {
		t.Fatalf("driver mysql: %v", err)
	}
	// Only Open creates a missing directory; inspecting creates nothing.
	missing := filepath.Join(dir, "no", "such", "dir", "l.db")
	if _, err := OpenExisting(ctx, Config{Driver: SQLite, DSN: missing, Table: "ledger"}); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("inspecting SQLite in a missing directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "no")); !os.IsNotExist(err) {
		t.Fatalf("inspecting created the directory: %v", err)
	}
	created, err := Open(ctx, Config{Driver: SQLite, DSN: missing, Table: "ledger"})
	if err != nil {
		t.Fatalf("SQLite in a missing directory: %v", err)
	}
	created.Close()
	s, err := Open(ctx, Config{Driver: SQLite, DSN: filepath.Join(dir, "l.db"), Table: "ledger_2"})
	if err != nil {
		t.Fatalf("valid table name: %v", err)
	}
	s.Close()
}

func TestRetryableClassification(t *testing.T) {
	for code, want := range map[string]bool{"40001": true, "40P01": true, "23505": false, "42601": false} {
		err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code})
		if got := postgresRetryable(&StmtError{Err: err}); got != want {
			t.Errorf("postgres %s retryable = %v, want %v", code, got, want)
		}
	}
	if postgresRetryable(errors.New("40001")) || sqliteRetryable(errors.New("database is locked")) {
		t.Error("plain errors must not be retryable")
	}
}

func TestRedactDSN(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:s3cret@h:5432/db?sslmode=disable": "postgres://u:xxxxx@h:5432/db?sslmode=disable",
		"host=h user=u password=s3cret dbname=d":        "host=h user=u password=xxxxx dbname=d",
		"host=h password='s3 cret' dbname=d":            "host=h password=xxxxx dbname=d",
		"postgres://h/db?password=s3cret&sslmode=x":     "postgres://h/db?password=xxxxx&sslmode=x",
		"/var/lib/ledger.db":                            "/var/lib/ledger.db",
	} {
		if got := redactDSN(in); got != want {
			t.Errorf("redactDSN(%q) = %q, want %q", in, got, want)
		}
	}
}
