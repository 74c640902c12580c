package sqlquery

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
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
	dsn := filepath.Join(t.TempDir(), "sub", "q.db") // the directory is created
	tables := fmt.Sprintf(`
dsn: %s
init_statements: [ "CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, n INTEGER NOT NULL)" ]
`, dsn)
	upsert := newTestProcessor(t, tables+`
query: INSERT INTO runs (run_id, n) VALUES (?, 1) ON CONFLICT (run_id) DO UPDATE SET n = n + 1
args_mapping: root = [ this.run ]
`)
	for _, run1 := range []string{"a", "a", "b"} {
		m := run(t, upsert, `{"run":"`+run1+`"}`)
		if err := m.GetError(); err != nil {
			t.Fatal(err)
		}
		if b, _ := m.AsBytes(); string(b) != `{"run":"`+run1+`"}` {
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
	if err := m.GetError(); err == nil || !strings.Contains(err.Error(), "no such table: missing") || !strings.Contains(err.Error(), dsn) {
		t.Fatalf("error = %v, want the database's error naming the file", err)
	}
}
