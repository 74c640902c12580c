package sqlquery

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

func newTestProcessor(t *testing.T, yaml string) *processor {
	t.Helper()
	conf, err := processorSpec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProcessor(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func run(t *testing.T, p *processor, content string) *service.Message {
	t.Helper()
	out, err := p.ProcessBatch(context.Background(), service.MessageBatch{service.NewMessage([]byte(content))})
	if err != nil {
		t.Fatal(err)
	}
	return out[0][0]
}

// A write keeps the message; a query replaces it with its rows; a failing
// statement flags the message with the database's error.
func TestSQLQueryWritesReadsAndFlagsErrors(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		dsn := filepath.Join(t.TempDir(), "sub", "q.db") // the directory is created
		sqlQueryRoundTrip(t, "driver: sqlite\ndsn: "+dsn+"\n", "?", dsn)
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := harness.StartPostgres(t).NewDatabase(t)
		sqlQueryRoundTrip(t, "driver: postgres\ndsn: "+dsn+"\n", "$1", "postgres database")
	})
}

func sqlQueryRoundTrip(t *testing.T, conn, placeholder, where string) {
	tables := conn + `init_statements: [ "CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, n INTEGER NOT NULL)" ]
`
	upsert := newTestProcessor(t, tables+fmt.Sprintf(`
query: INSERT INTO runs (run_id, n) VALUES (%s, 1) ON CONFLICT (run_id) DO UPDATE SET n = runs.n + 1
args_mapping: root = [ this.run ]
`, placeholder))
	for _, id := range []string{"a", "a", "b"} {
		m := run(t, upsert, `{"run":"`+id+`"}`)
		if err := m.GetError(); err != nil {
			t.Fatal(err)
		}
		if b, _ := m.AsBytes(); string(b) != `{"run":"`+id+`"}` {
			t.Fatalf("a statement without rows changed the message to %s", b)
		}
	}
	sel := newTestProcessor(t, tables+`
query: SELECT run_id, n FROM runs ORDER BY run_id
`)
	m := run(t, sel, `{}`)
	if b, _ := m.AsBytes(); string(b) != `[{"n":2,"run_id":"a"},{"n":1,"run_id":"b"}]` {
		t.Fatalf("rows: %s", b)
	}
	bad := newTestProcessor(t, tables+`
query: SELECT nope FROM missing
`)
	m = run(t, bad, `{}`)
	if err := m.GetError(); err == nil || !strings.Contains(err.Error(), "missing") || !strings.Contains(err.Error(), where) {
		t.Fatalf("error = %v, want the database's error naming the database", err)
	}
}
