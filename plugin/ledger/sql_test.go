package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/dedup"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// counterSQL is seed 001's counter, for SQLite.
func counterSQL(dsn, extra string) string {
	return fmt.Sprintf(`
key: ${! json("event_id") }
namespace: ${! json("producer") }
sql:
  driver: sqlite
  dsn: %s
  init_statements:
    - CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)
    - INSERT INTO counter (id, value) VALUES (1, 0) ON CONFLICT (id) DO NOTHING
  apply:
    - query: UPDATE counter SET value = value + ? WHERE id = 1
      args_mapping: root = [ this.delta ]
%s`, dsn, extra)
}

func event(id string, delta int) string {
	return fmt.Sprintf(`{"producer":"sensor-demo","event_id":%q,"delta":%d}`, id, delta)
}

func newSQLTestProcessor(t *testing.T, yaml string) *sqlProcessor {
	t.Helper()
	p, err := buildSQLProcessor(yaml)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func buildSQLProcessor(yaml string) (*sqlProcessor, error) {
	conf, err := processorSpec().ParseYAML(yaml, nil)
	if err != nil {
		return nil, err
	}
	s, err := parseSettings(conf)
	if err != nil {
		return nil, err
	}
	return newSQLProcessor(s, service.MockResources())
}

// openSQLite opens the test's database file independently of the
// processor, to read what was committed.
func openSQLite(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func queryInt(t *testing.T, db *sql.DB, q string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func processOne(t *testing.T, p *sqlProcessor, payload string) *service.Message {
	t.Helper()
	out, err := p.ProcessBatch(context.Background(), service.MessageBatch{service.NewMessage([]byte(payload))})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		return nil
	}
	if len(out) != 1 || len(out[0]) != 1 {
		t.Fatalf("want one message out, got %v", out)
	}
	return out[0][0]
}

// The seed's experiment in process: a redelivered event is recognised by
// its ledger row and the counter moves once.
func TestSQLApplyCountsEachEventOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "counter.db")
	p := newSQLTestProcessor(t, counterSQL(path, ""))
	if m := processOne(t, p, event("batch-42", 1)); m == nil || m.GetError() != nil {
		t.Fatalf("first copy should pass, got %v", m)
	}
	if m := processOne(t, p, event("batch-42", 1)); m != nil {
		t.Fatalf("redelivery should be dropped, got %v", m)
	}
	db := openSQLite(t, path)
	if v := queryInt(t, db, "SELECT value FROM counter WHERE id = 1"); v != 1 {
		t.Fatalf("counter = %d, want 1", v)
	}
	if n := queryInt(t, db, "SELECT COUNT(*) FROM dedup_ledger"); n != 1 {
		t.Fatalf("ledger rows = %d, want 1", n)
	}
}

func TestSQLApplyFlagsDuplicatesAndConflicts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "counter.db")
	p := newSQLTestProcessor(t, counterSQL(path, "on_duplicate: flag\n"))
	processOne(t, p, event("e1", 1))
	dup := processOne(t, p, event("e1", 1))
	if v, _ := dup.MetaGetMut(metaDuplicate); v != true {
		t.Fatalf("copy not flagged as duplicate: %v", dup)
	}
	conflict := processOne(t, p, event("e1", 5))
	if v, _ := conflict.MetaGetMut(metaConflict); v != true {
		t.Fatalf("different payload under e1 not flagged as conflict: %v", conflict)
	}
	if v := queryInt(t, openSQLite(t, path), "SELECT value FROM counter WHERE id = 1"); v != 1 {
		t.Fatalf("counter = %d, want 1: neither the duplicate nor the conflict may apply", v)
	}
}

// Copies arriving at once on many threads (and inside one batch) apply
// once: the ledger insert decides, in the database.
func TestSQLApplyConcurrentCopiesApplyOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "counter.db")
	p := newSQLTestProcessor(t, counterSQL(path, ""))
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := service.MessageBatch{service.NewMessage([]byte(event(fmt.Sprintf("ev-%d", i%4), 1)))}
			if i%3 == 0 { // some batches carry the copy twice
				batch = append(batch, service.NewMessage([]byte(event(fmt.Sprintf("ev-%d", i%4), 1))))
			}
			out, err := p.ProcessBatch(context.Background(), batch)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, b := range out {
				for _, m := range b {
					if m.GetError() != nil {
						t.Error(m.GetError())
					}
					passed++
				}
			}
		}()
	}
	wg.Wait()
	if passed != 4 {
		t.Fatalf("%d copies passed, want 4 (one per event)", passed)
	}
	if v := queryInt(t, openSQLite(t, path), "SELECT value FROM counter WHERE id = 1"); v != 4 {
		t.Fatalf("counter = %d, want 4", v)
	}
}

// An args_mapping that fails fails the message and commits nothing; the
// same key passes once the payload is right.
func TestSQLArgsMappingFailureCommitsNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "counter.db")
	p := newSQLTestProcessor(t, strings.Replace(counterSQL(path, ""), "root = [ this.delta ]", "root = [ this.delta.number() ]", 1))
	m := processOne(t, p, `{"producer":"sensor-demo","event_id":"e1","delta":"lots"}`)
	if m == nil || m.GetError() == nil || !strings.Contains(m.GetError().Error(), "args_mapping") || !strings.Contains(m.GetError().Error(), "sensor-demo/e1") {
		t.Fatalf("want the message failed with an args_mapping error naming the key, got %v", m)
	}
	db := openSQLite(t, path)
	if n := queryInt(t, db, "SELECT COUNT(*) FROM dedup_ledger"); n != 0 {
		t.Fatalf("ledger has %d rows after a failed mapping, want 0", n)
	}
	if m := processOne(t, p, event("e1", 1)); m == nil || m.GetError() != nil {
		t.Fatalf("the corrected message must pass, got %v", m)
	}
	if v := queryInt(t, db, "SELECT value FROM counter WHERE id = 1"); v != 1 {
		t.Fatalf("counter = %d, want 1", v)
	}
	// Objects are refused as arguments, with advice.
	p2 := newSQLTestProcessor(t, strings.Replace(counterSQL(filepath.Join(t.TempDir(), "c2.db"), ""), "root = [ this.delta ]", "root = [ this ]", 1))
	if m := processOne(t, p2, event("e2", 1)); m == nil || m.GetError() == nil || !strings.Contains(m.GetError().Error(), "format_json") {
		t.Fatalf("want an object argument refused, got %v", m)
	}
}

// A failing statement (constraint violation, missing table) rolls back the
// ledger row too; once the cause is fixed the retry applies exactly once.
func TestSQLFailingStatementRollsBackAndRetrySucceeds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "counter.db")
	p := newSQLTestProcessor(t, fmt.Sprintf(`
key: ${! json("event_id") }
sql:
  dsn: %s
  apply:
    - query: INSERT INTO seen (id) VALUES (?)
      args_mapping: root = [ this.event_id ]
    - query: UPDATE totals SET value = value + ? WHERE id = 1
      args_mapping: root = [ this.delta ]
`, path))
	db := openSQLite(t, path)
	if _, err := db.Exec(`CREATE TABLE seen (id TEXT PRIMARY KEY CHECK (id <> 'bad'))`); err != nil {
		t.Fatal(err)
	}
	// The second statement's table is missing.
	m := processOne(t, p, `{"event_id":"e1","delta":1}`)
	if m == nil || m.GetError() == nil || !strings.Contains(m.GetError().Error(), "totals") || !strings.Contains(m.GetError().Error(), "nothing was committed") {
		t.Fatalf("want a failure naming the statement, got %v", m)
	}
	if n := queryInt(t, db, "SELECT COUNT(*) FROM seen"); n != 0 {
		t.Fatalf("the first statement's row survived the rollback (%d rows)", n)
	}
	if n := queryInt(t, db, "SELECT COUNT(*) FROM dedup_ledger"); n != 0 {
		t.Fatalf("ledger row committed although a statement failed (%d rows)", n)
	}
	// A constraint violation fails the message the same way.
	if _, err := db.Exec(`CREATE TABLE totals (id INTEGER PRIMARY KEY, value INTEGER NOT NULL); INSERT INTO totals VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	if m := processOne(t, p, `{"event_id":"bad","delta":1}`); m == nil || m.GetError() == nil || !strings.Contains(strings.ToLower(m.GetError().Error()), "constraint") {
		t.Fatalf("want a constraint violation, got %v", m)
	}
	// The retry of e1 applies, once.
	for range 2 {
		if m := processOne(t, p, `{"event_id":"e1","delta":1}`); m != nil && m.GetError() != nil {
			t.Fatal(m.GetError())
		}
	}
	if v := queryInt(t, db, "SELECT value FROM totals WHERE id = 1"); v != 1 {
		t.Fatalf("total = %d, want 1", v)
	}
	if n := queryInt(t, db, "SELECT COUNT(*) FROM dedup_ledger"); n != 1 {
		t.Fatalf("ledger rows = %d, want 1", n)
	}
}

func TestSQLUnreachableDatabaseFailsAtStartWithClearError(t *testing.T) {
	port := harness.FreePort(t) // nothing listens there
	_, err := buildSQLProcessor(fmt.Sprintf(`
sql:
  driver: postgres
  dsn: postgres://app:hunter2@127.0.0.1:%d/app?sslmode=disable&connect_timeout=2
  connect_timeout: 3s
  startup_wait: 4s
`, port))
	if err == nil {
		t.Fatal("a processor was built on an unreachable database")
	}
	if !strings.Contains(err.Error(), "connect") || !strings.Contains(err.Error(), "gave up waiting for a read-write server") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error should say the connection failed, that start-up waited, and hide the password: %v", err)
	}
	// A directory that cannot be created (a file is in the way).
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = buildSQLProcessor("sql:\n  dsn: " + filepath.Join(blocker, "sub", "x.db") + "\n")
	if err == nil || !strings.Contains(err.Error(), "sub") {
		t.Fatalf("want an error naming the SQLite path that cannot be created, got %v", err)
	}
	// A missing directory is created, as for path.
	p := newSQLTestProcessor(t, "sql:\n  dsn: "+filepath.Join(t.TempDir(), "new", "dir", "x.db")+"\n")
	if p == nil {
		t.Fatal("no processor")
	}
	t.Logf("errors: %v", err)
}

func TestSQLSpecRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"key: x", "set path"},
		{"path: x.db\nsql:\n  dsn: y.db", "not both"},
		{"sql:\n  dsn: ''", "sql.dsn is empty"},
		{"sql:\n  driver: mysql\n  dsn: x", "driver"},
		{"sql:\n  dsn: x.db\n  apply:\n    - query: BEGIN", "transaction-control"},
		{"sql:\n  dsn: x.db\n  apply:\n    - query: \"UPDATE c SET v = v + 1; COMMIT\"", "COMMIT"},
		{"sql:\n  dsn: x.db\n  apply:\n    - query: \"/* note */ savepoint s1\"", "SAVEPOINT"},
		{"sql:\n  dsn: x.db\n  apply:\n    - query: \"-- x\\nrelease s1\"", "RELEASE"},
		{"sql:\n  dsn: x.db\n  apply:\n    - query: ROLLBACK", "transaction-control"},
		{"sql:\n  dsn: x.db\n  apply:\n    - query: ''", "empty"},
		{"sql:\n  dsn: x.db\n  apply:\n    - query: SELECT 1\n      args_mapping: 'root = ['", "args_mapping"},
		{"sql:\n  dsn: x.db\n  max_batch: 0", "max_batch"},
	} {
		conf, err := processorSpec().ParseYAML(tc.yaml, nil)
		if err == nil {
			_, err = parseSettings(conf)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %q: want an error containing %q, got %v", tc.yaml, tc.want, err)
		}
	}
}

// Without apply the SQL ledger works like the bbolt one: the key is
// recorded when the pipeline acknowledges, released when it fails.
func TestSQLWithoutApplyRecordsOnAckAndReleasesOnFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	p := newSQLTestProcessor(t, "sql:\n  dsn: "+path+"\nwait_timeout: 300ms\n")
	ctx := context.Background()
	deliver := func(id string, result error) (passed bool) {
		t.Helper()
		hctx, hooks := commit.WithHooks(ctx)
		out, err := p.ProcessBatch(hctx, service.MessageBatch{streamtest.Message("p", "event_id", id).WithContext(hctx)})
		if err != nil {
			t.Fatal(err)
		}
		passed = len(out) == 1 && out[0][0].GetError() == nil
		if err := hooks.Run(ctx, result); err != nil {
			t.Fatal(err)
		}
		return passed
	}
	if !deliver("e1", errors.New("output down")) {
		t.Fatal("first copy did not pass")
	}
	if !deliver("e1", nil) {
		t.Fatal("the retry after a failure must pass (the claim was released)")
	}
	if deliver("e1", nil) {
		t.Fatal("a copy of a recorded key passed")
	}
	if n := queryInt(t, openSQLite(t, path), "SELECT COUNT(*) FROM dedup_ledger"); n != 1 {
		t.Fatalf("ledger rows = %d, want 1", n)
	}

	// Two local copies in flight: the second waits for the first and is a
	// duplicate once it committed.
	hctx, hooks := commit.WithHooks(ctx)
	out, _ := p.ProcessBatch(hctx, service.MessageBatch{streamtest.Message("p", "event_id", "e2").WithContext(hctx)})
	if len(out) != 1 || out[0][0].GetError() != nil {
		t.Fatal("first copy of e2 did not pass")
	}
	second := make(chan []service.MessageBatch, 1)
	go func() {
		c2, _ := commit.WithHooks(ctx)
		o, _ := p.ProcessBatch(c2, service.MessageBatch{streamtest.Message("p", "event_id", "e2").WithContext(c2)})
		second <- o
	}()
	if err := hooks.Run(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if o := <-second; len(o) != 0 {
		t.Fatalf("second copy of e2 passed while the first was in flight: %v", o)
	}

	// A message without delivery hooks fails, saying how to fix it.
	out, _ = p.ProcessBatch(ctx, service.MessageBatch{streamtest.Message("p", "event_id", "e3")})
	if len(out) != 1 || !errors.Is(out[0][0].GetError(), dedup.ErrNoHooksSQL) {
		t.Fatalf("want errNoHooksSQL, got %v", out)
	}
}

// PostgreSQL: the same counter, concurrent copies from two processors
// (as two instances would be) with separate pools, apply once.
func TestSQLApplyPostgresCountsOnce(t *testing.T) {
	pg := harness.StartPostgres(t)
	dsn := pg.NewDatabase(t)
	conf := func(table string) string {
		return fmt.Sprintf(`
key: ${! json("event_id") }
namespace: ${! json("producer") }
sql:
  driver: postgres
  dsn: %s
  table: %s
  init_statements:
    - CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value BIGINT NOT NULL)
    - INSERT INTO counter (id, value) VALUES (1, 0) ON CONFLICT (id) DO NOTHING
  apply:
    - query: UPDATE counter SET value = value + $1 WHERE id = 1
      args_mapping: root = [ this.delta ]
`, dsn, table)
	}
	// Two stores on one table (different DSN strings give separate
	// pools, like two processes).
	p1 := newSQLTestProcessor(t, conf("ledger"))
	p2 := newSQLTestProcessor(t, strings.Replace(conf("ledger"), "sslmode=disable", "sslmode=disable&application_name=second", 1))
	if p1.sh == p2.sh {
		t.Fatal("the test needs two separate pools")
	}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := p1
			if i%2 == 1 {
				p = p2
			}
			out, err := p.ProcessBatch(context.Background(), service.MessageBatch{service.NewMessage([]byte(event(fmt.Sprintf("ev-%d", i%10), 1)))})
			if err != nil {
				t.Error(err)
			}
			for _, b := range out {
				for _, m := range b {
					if m.GetError() != nil {
						t.Error(m.GetError())
					}
				}
			}
		}()
	}
	wg.Wait()
	var v int
	if err := p1.sh.Store().DB().QueryRow("SELECT value FROM counter WHERE id = 1").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != 10 {
		t.Fatalf("counter = %d, want 10 (ten distinct events)", v)
	}
}

// Processors on one table share one store, so they must agree on what the
// store does for them; a second one with other settings is refused rather
// than silently given the first one's.
func TestSQLSecondProcessorWithOtherSettingsIsRefused(t *testing.T) {
	dsn := filepath.Join(t.TempDir(), "shared.db")
	first := newSQLTestProcessor(t, "sql:\n  dsn: "+dsn+"\n  init_statements: [ 'CREATE TABLE IF NOT EXISTS a (x INTEGER)' ]\n")
	if first == nil {
		t.Fatal("no processor")
	}
	same := newSQLTestProcessor(t, "sql:\n  dsn: "+dsn+"\n  init_statements: [ 'CREATE TABLE IF NOT EXISTS a (x INTEGER)' ]\n")
	if same == nil {
		t.Fatal("a processor with identical settings was refused")
	}
	_, err := buildSQLProcessor("sql:\n  dsn: " + dsn + "\n  init_statements: [ 'CREATE TABLE IF NOT EXISTS b (x INTEGER)' ]\n")
	if err == nil || !strings.Contains(err.Error(), "different settings") {
		t.Fatalf("a processor with other init_statements on the same table: got %v, want a refusal", err)
	}
}
