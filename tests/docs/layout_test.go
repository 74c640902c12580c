// Package docs checks that the project's maps tell the truth: README's
// Layout names every package and no other, and docs/guarantees.md names
// code that exists where each guarantee is enforced.
package docs

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the module root, from this package's directory.
const root = "../.."

// layoutEntry is a package line of README's Layout block: four spaces, then
// a directory under cmd/, plugin/ or internal/.
var layoutEntry = regexp.MustCompile(`(?m)^    ((?:cmd|plugin|internal)/[a-z0-9_/-]+)/ `)

// TestReadmeLayoutListsEveryPackage: every Go package under cmd/, plugin/
// and internal/ has a line in README's Layout section and a package doc
// comment ("Package x ..." or "Command x ..."), and every such line names a
// package that exists.
func TestReadmeLayoutListsEveryPackage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "\n## Layout\n")
	if start < 0 {
		t.Fatal("README.md has no Layout section")
	}
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	var listed []string
	for _, m := range layoutEntry.FindAllStringSubmatch(section, -1) {
		listed = append(listed, m[1])
	}
	pkgs := goPackages(t)
	for _, p := range pkgs {
		if !slices.Contains(listed, p) {
			t.Errorf("README.md Layout does not list the package %s/ (add a line: what it holds, from its package comment)", p)
		}
		if doc := packageDoc(t, p); doc == "" {
			t.Errorf("package %s has no package comment", p)
		}
	}
	for _, l := range listed {
		if !slices.Contains(pkgs, l) {
			t.Errorf("README.md Layout lists %s/, which is not a Go package (stale line)", l)
		}
	}
	if len(listed) < 10 {
		t.Fatalf("found only %d package lines in README.md Layout: %q", len(listed), listed)
	}
}

// goPackages lists the directories under cmd/, plugin/ and internal/ that
// hold non-test Go files, relative to the root.
func goPackages(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, top := range []string{"cmd", "plugin", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			files, _ := filepath.Glob(filepath.Join(path, "*.go"))
			for _, f := range files {
				if !strings.HasSuffix(f, "_test.go") {
					rel, _ := filepath.Rel(root, path)
					out = append(out, filepath.ToSlash(rel))
					break
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// packageDoc returns the package comment of the package in dir.
func packageDoc(t *testing.T, dir string) string {
	t.Helper()
	fset := token.NewFileSet()
	files, _ := filepath.Glob(filepath.Join(root, dir, "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if af.Doc != nil {
			if doc := af.Doc.Text(); strings.HasPrefix(doc, "Package ") || strings.HasPrefix(doc, "Command ") {
				return doc
			}
		}
	}
	return ""
}
