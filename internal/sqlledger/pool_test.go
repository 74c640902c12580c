package sqlledger

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// Consumers started at once on a fresh PostgreSQL database all run the same
// init statements; CREATE TABLE IF NOT EXISTS can then collide in the
// catalog (a unique violation) although the statement is idempotent. Every
// consumer must start: init statements are retried (ExecSetup) as Open
// retries its own table creation.
func TestInitStatementsSurviveConcurrentStarts(t *testing.T) {
	pg := harness.StartPostgres(t)
	const consumers, rounds = 8, 20
	for round := range rounds {
		dsn := pg.NewDatabase(t)
		stores := make([]*Store, consumers)
		for i := range stores {
			// Its own table, as another consumer's would be opened.
			stores[i] = open(t, postgresBackend(pg), dsn, func(c *Config) { c.Table = fmt.Sprintf("ledger_%d", i) })
		}
		errs := make([]error, consumers)
		var start, wg sync.WaitGroup
		start.Add(1)
		for i, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start.Wait()
				errs[i] = s.ExecSetup(testCtx(t), `CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)`)
			}()
		}
		start.Done()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, consumer %d of %d started at once: %v", round, i, consumers, err)
			}
		}
	}
}

// ApplyAll answers each entry with its own outcome, and Verdict reads it:
// the first apply of a key passes (its statement committed), a second copy
// is a duplicate, a copy with another hash a conflict.
func TestApplyAllVerdicts(t *testing.T) {
	dsn := filepath.Join(t.TempDir(), "l.sqlite")
	p, err := OpenPool(context.Background(), PoolConfig{
		Config: Config{Driver: SQLite, DSN: dsn, Table: "ledger"}, MaxBatch: 8,
		Init: []string{"CREATE TABLE counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)", "INSERT INTO counter VALUES (1, 0)"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	incr := []Exec{{Query: "UPDATE counter SET value = value + 1 WHERE id = 1"}}
	entry := func(id, hash string) Entry {
		return Entry{Key: claims.Key{Namespace: "p", ID: id}, Hash: []byte(hash), Stmts: incr}
	}
	outs := p.ApplyAll(context.Background(), []Entry{entry("e1", "a"), entry("e2", "a")})
	outs = append(outs, p.ApplyAll(context.Background(), []Entry{entry("e1", "a"), entry("e2", "b")})...)
	hashes := []string{"a", "a", "a", "b"}
	var got []string
	for i, o := range outs {
		if o.Err != nil {
			t.Fatalf("outcome %d: %v", i, o.Err)
		}
		got = append(got, o.Verdict([]byte(hashes[i])).String())
	}
	if fmt.Sprint(got) != "[pass pass duplicate conflict]" {
		t.Fatalf("verdicts %v", got)
	}
	var v int
	if err := p.Store().DB().QueryRow("SELECT value FROM counter WHERE id = 1").Scan(&v); err != nil || v != 2 {
		t.Fatalf("counter %d (%v), want 2: only the passed entries ran their statement", v, err)
	}
}
