package imports

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
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
