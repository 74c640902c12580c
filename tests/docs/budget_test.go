package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// budgets are the most lines a page may have: these pages answer a user's
// questions (what figure, what guarantee, which test or command shows it),
// and history of how they changed stays in git.
var budgets = map[string]int{
	"docs/performance.md": 400,
	"docs/guarantees.md":  500,
}

// TestDocsStayWithinTheirLineBudgets: each budgeted page is within its
// line budget.
func TestDocsStayWithinTheirLineBudgets(t *testing.T) {
	for page, max := range budgets {
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "\n"); n > max {
			t.Errorf("%s has %d lines, over its budget of %d: keep current figures and guarantees with their tests, drop history (git keeps it), or move long material to a page of its own and link it", page, n, max)
		}
	}
}

// namedTest is a test or benchmark a page names: TestX or BenchmarkX; a
// name followed by * is a pattern, not a name.
var namedTest = regexp.MustCompile(`\b((?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*)(\*?)`)

// TestDocsNameTestsThatExist: every test, benchmark and fuzz function that
// README.md and the pages of docs/ name as the evidence for a figure or a
// guarantee is declared in some _test.go file of the module.
func TestDocsNameTestsThatExist(t *testing.T) {
	declared := testFuncs(t)
	if len(declared) < 100 {
		t.Fatalf("found only %d test functions under %s", len(declared), root)
	}
	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	pages = append(pages, filepath.Join(root, "README.md"))
	if len(pages) < 5 {
		t.Fatalf("found only %d pages: %q", len(pages), pages)
	}
	named := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range namedTest.FindAllStringSubmatch(string(b), -1) {
			if m[2] == "*" {
				continue
			}
			named++
			if !declared[m[1]] {
				t.Errorf("%s names %s, which no _test.go file declares", page, m[1])
			}
		}
	}
	if named < 50 {
		t.Fatalf("the pages name only %d tests", named)
	}
}

// testFuncDecl is the start of a test, benchmark or fuzz function.
var testFuncDecl = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)[A-Za-z0-9_]*)\(`)

// testFuncs returns the names of the test, benchmark and fuzz functions
// declared in the module's _test.go files.
func testFuncs(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "vendor") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFuncDecl.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
