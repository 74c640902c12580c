package imports

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxLines bounds a non-test Go file of the binary's rooms: past it a file
// holds more than one thing, and is split by what it holds.
const maxLines = 600

func TestNoSourceFileOverMaxLines(t *testing.T) {
	for _, dir := range []string{"cmd", "internal", "plugin"} {
		err := filepath.WalkDir(filepath.Join(root(t), dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if n := bytes.Count(b, []byte("\n")); n > maxLines {
				rel, _ := filepath.Rel(root(t), path)
				t.Errorf("%s has %d lines (at most %d): split it by what it holds", rel, n, maxLines)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// driverTest is code that asks which SQL driver it runs on.
var driverTest = regexp.MustCompile(`(==|!=)\s*(sqlledger\.)?(SQLite|Postgres)\b|\b(SQLite|Postgres)\s*(==|!=)|\.driver\s*(==|!=)|case\s+(sqlledger\.)?(SQLite|Postgres)\b`)

// What differs between SQL databases lives in internal/sqlledger's
// dialect table: no other non-test file of cmd/, internal/ or plugin/
// tests which driver it runs on, so a new driver is one entry there (plus
// its tests).
func TestSQLDriverKnowledgeIsInTheDialectTable(t *testing.T) {
	dialect := filepath.Join("internal", "sqlledger", "dialect.go")
	for _, dir := range []string{"cmd", "internal", "plugin"} {
		err := filepath.WalkDir(filepath.Join(root(t), dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			rel, _ := filepath.Rel(root(t), path)
			if rel == dialect {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(b), "\n") {
				if driverTest.MatchString(line) {
					t.Errorf("%s:%d tests the SQL driver (%s): put the difference in %s's dialect table", rel, i+1, strings.TrimSpace(line), dialect)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
