package imports

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// testOnlyPlugins are plugin/ packages that only tests link, where a
// goroutine drives a test stream.
var testOnlyPlugins = []string{filepath.Join("plugin", "internal", "streamtest")}

// Plugin packages are glue: the loops a component needs (reconnects, link
// watches, outbox stats, a connection's lifetime) belong to the engines
// and the client, which own and bound them. No `go` statement in plugin/
// non-test code.
func TestNoGoroutineStartedInPlugins(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(root(t), "plugin"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, _ := filepath.Rel(root(t), path)
		for _, dir := range testOnlyPlugins {
			if filepath.Dir(rel) == dir {
				return nil
			}
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok {
				t.Errorf("%s:%d starts a goroutine: let the engine or client that owns the loop start it", rel, fset.Position(g.Pos()).Line)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
