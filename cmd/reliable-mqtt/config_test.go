package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// Every example pipeline in config/ must parse and lint cleanly with the
// components compiled into this binary.
func TestExampleConfigsLint(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no example configs found in config/")
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.yaml") {
			continue // `reliable-mqtt test` definitions, not pipelines
		}
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			sb := service.NewStreamBuilder()
			// Configs may name environment variables with defaults (${X:default}).
			sb.SetEnvVarLookupFunc(func(string) (string, bool) { return "", false })
			if err := sb.SetYAML(string(b)); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
		})
	}
}
