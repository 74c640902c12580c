package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// yamlBlock is a fenced YAML block of a Markdown page.
var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// Every YAML block in these pages that is a pipeline (it has a top-level
// input or output) parses and lints cleanly with this binary's components,
// except a block marked as a Redpanda Connect config or as an excerpt.
func TestDocsConfigsLint(t *testing.T) {
	for _, page := range []string{"guarantees.md", "coming-from-connect.md", "operations.md"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "docs", page))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range yamlBlock.FindAllStringSubmatch(string(b), -1) {
			conf := m[1]
			if strings.HasPrefix(conf, "# Redpanda Connect") {
				continue // a Connect config shown for comparison: this binary has no mqtt
			}
			if strings.HasPrefix(conf, "# An excerpt") {
				continue // the fields a point needs, not a whole pipeline
			}
			if !strings.HasPrefix(conf, "input:") && !strings.HasPrefix(conf, "output:") && !strings.Contains(conf, "\ninput:") && !strings.Contains(conf, "\noutput:") {
				continue
			}
			n++
			sb := service.NewStreamBuilder()
			sb.SetEnvVarLookupFunc(func(string) (string, bool) { return "", false })
			if err := sb.SetYAML(conf); err != nil {
				t.Errorf("docs/%s, pipeline %d does not lint: %v\n%s", page, n, err, conf)
			}
		}
		if n == 0 {
			t.Errorf("docs/%s has no pipeline to lint", page)
		}
	}
}
