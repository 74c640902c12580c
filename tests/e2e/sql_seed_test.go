package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/failpoint"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// sqlSeedRun is seed 001 with the real binary: the consumer's SQL
// transaction (ledger row + counter update) commits, and the process
// SIGKILLs itself at failpoint sql-committed — committed, not yet passed
// on, so never acknowledged. Restarted with the same client ID, it resumes
// its session and Mosquitto redelivers the event with DUP set.
//
// It returns the counter, the ledger's row count and the restarted run's
// verdict on the redelivery ("duplicate=true" when the ledger recognised
// it).
func sqlSeedRun(t *testing.T, driver, dsn string, blind bool) (counter, rows int64, redelivery string) {
	t.Helper()
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	clientID := fmt.Sprintf("sql-seed-%s-%v-%d", driver, blind, time.Now().UnixNano())
	ledgerSession(t, m.URL(), clientID)
	cfg := sqlCounter{url: m.URL(), clientID: clientID, driver: driver, dsn: dsn, blind: blind}
	dir := t.TempDir()

	p1 := harness.RunPipeline(t, cfg.yaml(), harness.ProcOptions{Dir: dir, Env: []string{failpoint.EnvVar + "=" + failpoint.SQLCommitted}})
	// The session exists, so the broker queues the event for the consumer
	// even if it is not connected yet.
	harness.Publish(t, m.URL(), "events/in", [][]byte{ledgerEvent("batch-42")})
	code, err := p1.Wait(30 * time.Second)
	if err != nil {
		t.Fatalf("consumer never reached failpoint %s: %v\n%s", failpoint.SQLCommitted, err, p1.Log())
	}
	if code != -1 {
		t.Fatalf("consumer exited with %d, want death by SIGKILL at the failpoint\n%s", code, p1.Log())
	}
	if c, r := sqlState(t, driver, dsn); c != 1 || r != 1 {
		t.Fatalf("after the crash: counter %d, ledger rows %d; want the committed 1 and 1", c, r)
	}

	p2 := harness.RunPipeline(t, cfg.yaml(), harness.ProcOptions{Dir: dir})
	if !p2.WaitForLog("after event=batch-42", 30*time.Second) {
		t.Fatalf("the broker did not redeliver batch-42 to the restarted consumer\n%s", p2.Log())
	}
	if !strings.Contains(p2.RunLog(), "delivery event=batch-42 dup=true") {
		t.Errorf("the redelivery did not carry the MQTT DUP flag:\n%s", p2.RunLog())
	}
	log := p2.RunLog()
	i := strings.Index(log, "after event=batch-42")
	redelivery = log[i:]
	if j := strings.IndexAny(redelivery, "\"\n"); j > 0 {
		redelivery = redelivery[:j]
	}
	if err := p2.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	counter, rows = sqlState(t, driver, dsn)
	return counter, rows, redelivery
}

// sqlSeedTable runs the blind and the ledger consumer and checks seed 001's
// table:
//
//	blind:  counter=2 (the redelivery applied again)
//	ledger: counter=1, ledger_rows=1 (the redelivery found the row)
//
// "blind" is dedup_ledger keyed by a fresh UUID per delivery: every copy
// looks new, so the ledger is as useless as no ledger at all — the counter
// update runs on every delivery, exactly like the seed's naive consumer.
// (It leaves one useless ledger row per delivery, where the seed's naive
// consumer had none.)
func sqlSeedTable(t *testing.T, driver string, dsn func(t *testing.T) string) {
	var bc, br, lc, lr int64
	var bv, lv string
	t.Run("blind", func(t *testing.T) {
		bc, br, bv = sqlSeedRun(t, driver, dsn(t), true)
		if bc != 2 {
			t.Fatalf("blind consumer: counter = %d, want 2 (the crash window did not open)", bc)
		}
	})
	t.Run("ledger", func(t *testing.T) {
		lc, lr, lv = sqlSeedRun(t, driver, dsn(t), false)
		if lc != 1 || lr != 1 {
			t.Fatalf("ledger consumer: counter = %d, ledger rows = %d; want 1 and 1", lc, lr)
		}
		if !strings.Contains(lv, "duplicate=true") {
			t.Fatalf("the redelivery was not flagged as a duplicate: %q", lv)
		}
	})
	t.Logf("%s blind:  counter=%d ledger_rows=%d (one per delivery, keyed by UUID) redelivery: %s", driver, bc, br, bv)
	t.Logf("%s ledger: counter=%d ledger_rows=%d redelivery: %s", driver, lc, lr, lv)
}

// TestSQLSeed001SQLite: seed 001 against Mosquitto and an embedded SQLite
// file.
func TestSQLSeed001SQLite(t *testing.T) {
	sqlSeedTable(t, "sqlite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "counter.db") })
}

// TestSQLSeed001Postgres: the same against PostgreSQL.
func TestSQLSeed001Postgres(t *testing.T) {
	pg := harness.StartPostgres(t)
	sqlSeedTable(t, "postgres", func(t *testing.T) string { return pg.NewDatabase(t) })
}
