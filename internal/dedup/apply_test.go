package dedup

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
)

// Apply commits a new key with its statements (Pass), finds a key applied
// before (Duplicate, or Conflict with another payload, its statements not
// run again), and fails an entry whose statement fails, committing nothing
// of it.
func TestApplyDecidesEachEntry(t *testing.T) {
	p, err := sqlledger.OpenPool(context.Background(), sqlledger.PoolConfig{
		Config:   sqlledger.Config{Driver: sqlledger.SQLite, DSN: filepath.Join(t.TempDir(), "l.sqlite"), Table: "ledger"},
		Init:     []string{"CREATE TABLE IF NOT EXISTS hits (k TEXT)"},
		MaxBatch: 8,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	g := newGate(SQL(p), false)
	entry := func(id, payload, stmt string) sqlledger.Entry {
		h := Hash([]byte(payload))
		return sqlledger.Entry{Key: claims.Key{Namespace: "n", ID: id}, Hash: h[:], Stmts: []sqlledger.Exec{{Query: stmt, Args: nil}}}
	}
	insert := "INSERT INTO hits VALUES ('x')"
	ctx := context.Background()
	first := g.Apply(ctx, p, []sqlledger.Entry{entry("a", "1", insert)})
	if first[0].Err != nil || first[0].Verdict != claims.Pass {
		t.Fatalf("first copy: %+v, want Pass", first[0])
	}
	again := g.Apply(ctx, p, []sqlledger.Entry{
		entry("a", "1", insert), entry("a", "2", insert), entry("b", "1", "INSERT INTO missing VALUES (1)"),
	})
	if again[0].Verdict != claims.Duplicate || again[0].Err != nil {
		t.Errorf("same payload: %+v, want Duplicate", again[0])
	}
	if again[1].Verdict != claims.Conflict || again[1].Err != nil {
		t.Errorf("other payload: %+v, want Conflict", again[1])
	}
	if again[2].Err == nil {
		t.Errorf("failing statement: %+v, want an error", again[2])
	}
	if g.passed.n.Load() != 1 || g.commits.n.Load() != 1 {
		t.Errorf("passed %d, commits %d, want 1 and 1", g.passed.n.Load(), g.commits.n.Load())
	}
	retry := g.Apply(ctx, p, []sqlledger.Entry{entry("b", "1", insert)})
	if retry[0].Err != nil || retry[0].Verdict != claims.Pass {
		t.Errorf("b after its failed transaction: %+v, want Pass (nothing was committed)", retry[0])
	}
}
