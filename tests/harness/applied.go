package harness

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the SQLite driver the binary uses
)

// AppliedRun is what the shipped consumer (config/consumer.yaml) applied
// for one publisher run.
type AppliedRun struct {
	Count, Min, Max int // readings applied, lowest and highest seq
	Duplicates      int // copies its ledger dropped (the runs table)
}

// Applied reads the shipped consumer's SQLite database at dsn: per run ID,
// the readings applied (applied_events has one row per (run, seq): a
// reading applied twice would fail its INSERT) and the duplicates the
// ledger dropped. Before the consumer created its tables it is empty.
func Applied(t testing.TB, dsn string) map[string]AppliedRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// database/sql and the driver the binary uses, not sqlledger: its own
	// tests use this harness. The consumer writes while this reads.
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, err := sql.Open("sqlite", dsn+sep+"_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatalf("open the consumer's database: %v", err)
	}
	defer db.Close()
	out := map[string]AppliedRun{}
	rows, err := db.QueryContext(ctx, "SELECT run_id, COUNT(*), MIN(seq), MAX(seq) FROM applied_events GROUP BY run_id")
	if err != nil && strings.Contains(err.Error(), "no such table") {
		return out // the consumer has not created it yet
	}
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var r AppliedRun
		if err := rows.Scan(&id, &r.Count, &r.Min, &r.Max); err != nil {
			t.Fatal(err)
		}
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	dups, err := db.QueryContext(ctx, "SELECT run_id, duplicates FROM runs")
	if err != nil {
		return out // no runs table: the consumer has not counted any
	}
	defer dups.Close()
	for dups.Next() {
		var id string
		var n int
		if err := dups.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		r := out[id]
		r.Duplicates = n
		out[id] = r
	}
	return out
}
