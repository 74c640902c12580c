package e2e

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// TestSQLFailingApplyCommitsNothingAndRetries: the counter table does not
// exist when the events arrive, so every apply transaction fails ("no such
// table"). The real binary must then commit nothing — no counter change, no
// ledger row — and must not acknowledge: reliable_mqtt_in redelivers the
// messages with backoff. Once the test creates the table, the retries
// apply each event exactly once, and later copies of the same events are
// recognised.
func TestSQLFailingApplyCommitsNothingAndRetries(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	clientID := "sql-failing-apply"
	ledgerSession(t, m.URL(), clientID)
	dsn := filepath.Join(t.TempDir(), "counter.db")
	cfg := sqlCounter{url: m.URL(), clientID: clientID, driver: "sqlite", dsn: dsn, noInit: true}
	p := harness.RunPipeline(t, cfg.yaml(), harness.ProcOptions{})

	ids := []string{"e1", "e2", "e3"}
	var events [][]byte
	for _, id := range ids {
		events = append(events, ledgerEvent(id))
	}
	harness.Publish(t, m.URL(), "events/in", events)
	if !p.WaitForLog("no such table: counter", 20*time.Second) {
		t.Fatalf("the apply statement never failed as expected\n%s", p.Log())
	}
	// Let the retries fail a few more times.
	harness.Eventually(t, 20*time.Second, "three failed attempts of e1", func() bool {
		return strings.Count(p.RunLog(), "delivery event=e1 ") >= 3
	})
	if _, rows := sqlState(t, "sqlite", dsn); rows != 0 {
		t.Fatalf("%d ledger rows committed by failing transactions, want 0", rows)
	}

	db, err := sql.Open("sqlite", dsn+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, `CREATE TABLE counter (id INTEGER PRIMARY KEY, value BIGINT NOT NULL); INSERT INTO counter VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "the retried events to be applied", func() bool {
		c, _ := sqlState(t, "sqlite", dsn)
		return c >= 3
	})
	// Copies of the applied events: recognised, not applied again.
	harness.Publish(t, m.URL(), "events/in", events)
	harness.Eventually(t, 20*time.Second, "the copies to be flagged as duplicates", func() bool {
		return strings.Count(p.RunLog(), "duplicate=true") >= 3
	})
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	c, rows := sqlState(t, "sqlite", dsn)
	failed := strings.Count(p.RunLog(), "no such table: counter")
	t.Logf("counter=%d ledger_rows=%d after %d failed attempts", c, rows, failed)
	if c != 3 || rows != 3 {
		t.Fatalf("counter = %d, ledger rows = %d; want 3 and 3", c, rows)
	}
}
