package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// codeRef is a reference to code in docs/guarantees.md:
// `internal/outbox/outbox.go: Outbox.Remove` or `internal/codec/codec.go: EventID`.
var codeRef = regexp.MustCompile("`((?:cmd|plugin|internal)/[a-z0-9_/-]+\\.go): ((?:[A-Za-z_][A-Za-z0-9_]*\\.)?[A-Za-z_][A-Za-z0-9_]*)`")

// Sections of docs/guarantees.md that state no guarantee of their own: an
// overview, a worked example, a list of tests.
var noGuarantee = map[string]string{
	"At a glance": "a table of the sections below and their tests",
}

// TestGuaranteesNameCodeThatExists: every guarantee section of
// docs/guarantees.md (each ### section, and each ## section without one)
// has an "Enforced in:" line naming the code that enforces it, and every
// `file.go: Func` reference on the page names a file that exists and
// declares that function (or Type.Method).
func TestGuaranteesNameCodeThatExists(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "guarantees.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)

	refs := codeRef.FindAllStringSubmatch(text, -1)
	if len(refs) < 20 {
		t.Fatalf("docs/guarantees.md names only %d places in the code", len(refs))
	}
	decls := map[string]map[string]bool{}
	for _, r := range refs {
		file, name := r[1], r[2]
		if decls[file] == nil {
			decls[file] = funcsIn(t, file)
		}
		if decls[file] == nil {
			t.Errorf("docs/guarantees.md names %s, which does not exist", file)
			continue
		}
		if !decls[file][name] {
			t.Errorf("docs/guarantees.md names %s: %s, which %s does not declare", file, name, file)
		}
	}

	for _, s := range guaranteeSections(text) {
		if _, ok := noGuarantee[s.title]; ok {
			continue
		}
		enforced := strings.Index(s.body, "Enforced in:")
		if enforced < 0 || !codeRef.MatchString(s.body[enforced:]) {
			t.Errorf("docs/guarantees.md section %q names no code where it is enforced (a line \"Enforced in: `package/file.go: Func`\")", s.title)
		}
	}
}

type section struct{ title, body string }

// guaranteeSections splits the page into its ### sections and the ##
// sections that have none, skipping fenced code blocks.
func guaranteeSections(text string) []section {
	var out []section
	var cur *section
	fenced := false
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
		}
		cur = nil
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		switch {
		case fenced:
		case strings.HasPrefix(line, "### "):
			flush()
			cur = &section{title: strings.TrimPrefix(line, "### ")}
			continue
		case strings.HasPrefix(line, "## "):
			flush()
			cur = &section{title: strings.TrimPrefix(line, "## ")}
			continue
		}
		if cur != nil {
			cur.body += line + "\n"
		}
	}
	flush()
	// A ## section followed by ### sections is their heading, not a
	// guarantee of its own.
	var kept []section
	for i, s := range out {
		if i+1 < len(out) && isParentOf(text, s.title, out[i+1].title) {
			continue
		}
		kept = append(kept, s)
	}
	return kept
}

// isParentOf reports whether the ## heading title is directly followed, in
// text, by the ### heading next (with no other ## heading between).
func isParentOf(text, title, next string) bool {
	i := strings.Index(text, "\n## "+title+"\n")
	j := strings.Index(text, "\n### "+next+"\n")
	return i >= 0 && j > i && !strings.Contains(text[i+1:j], "\n## ")
}

// funcsIn returns the functions file declares, as "Func" and
// "Type.Method"; nil if the file does not exist.
func funcsIn(t *testing.T, file string) map[string]bool {
	t.Helper()
	path := filepath.Join(root, file)
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		name := fd.Name.Name
		if fd.Recv != nil && len(fd.Recv.List) == 1 {
			typ := fd.Recv.List[0].Type
			if s, ok := typ.(*ast.StarExpr); ok {
				typ = s.X
			}
			if ix, ok := typ.(*ast.IndexExpr); ok { // a generic receiver
				typ = ix.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				name = id.Name + "." + name
			}
		}
		out[name] = true
	}
	return out
}
