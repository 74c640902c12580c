package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// The committed reference pages must match the specs: run `go run ./cmd/gendocs`.
func TestComponentDocsAreUpToDate(t *testing.T) {
	pages, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no plugin is registered")
	}
	for name, want := range pages {
		got, err := os.ReadFile(filepath.Join("..", "..", "docs", "components", name))
		if err != nil {
			t.Fatalf("%s: %v (run: go run ./cmd/gendocs)", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("docs/components/%s is stale: run go run ./cmd/gendocs", name)
		}
	}
}
