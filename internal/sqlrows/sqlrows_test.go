package sqlrows

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Open creates the SQLite file's directory and runs the init statements;
// Query gives rows as objects, bytes as strings, and ok false for a
// statement without columns.
func TestOpenAndQuery(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "q.db")
	db, err := Open("sqlite", path, []string{
		"CREATE TABLE t (k TEXT, n INTEGER, b BLOB)",
		"INSERT INTO t VALUES ('a', 1, x'6869'), ('b', 2, NULL)",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if db.Where != "sqlite database "+path {
		t.Errorf("Where = %q", db.Where)
	}
	ctx := context.Background()
	rows, ok, err := db.Query(ctx, "SELECT k, n, b FROM t WHERE n >= ? ORDER BY k", []any{1})
	want := []any{
		map[string]any{"k": "a", "n": int64(1), "b": "hi"},
		map[string]any{"k": "b", "n": int64(2), "b": nil},
	}
	if err != nil || !ok || !reflect.DeepEqual(rows, want) {
		t.Errorf("Query = %v, %v, %v; want %v", rows, ok, err, want)
	}
	if rows, ok, err := db.Query(ctx, "SELECT k FROM t WHERE n > 5", nil); err != nil || !ok || len(rows) != 0 {
		t.Errorf("no rows: %v, %v, %v; want an empty list", rows, ok, err)
	}
	if _, ok, err := db.Query(ctx, "UPDATE t SET n = n + 1", nil); err != nil || ok {
		t.Errorf("a statement without columns: ok %v, err %v; want false, nil", ok, err)
	}
	if _, _, err := db.Query(ctx, "SELECT missing FROM t", nil); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a bad query: %v", err)
	}
}

func TestOpenNamesTheFailingInitStatement(t *testing.T) {
	_, err := Open("sqlite", filepath.Join(t.TempDir(), "q.db"), []string{"SELECT 1", "NOT SQL"})
	if err == nil || !strings.Contains(err.Error(), "init_statements[1]") {
		t.Fatalf("Open = %v, want an error naming init_statements[1]", err)
	}
}
