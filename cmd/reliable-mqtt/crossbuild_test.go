package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// The binary builds for Windows and macOS too; crash points (internal/
// failpoint) must not tie it to Linux.
//
// What can tie it to one OS is Go source that does not type-check for the
// other (a syscall, a constant, a file with a build constraint), so the
// test type-checks, from source, every package the binary links for each
// GOOS, with the files `go list` selects for that GOOS. That is the
// compiler's front end (go/types is what `go vet` checks with) without its
// code generation and link, which made two cold cross builds of Benthos
// cost minutes; CGO_ENABLED=0 as in the release build.
func TestBuildsForWindowsAndDarwin(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks Benthos for two more systems")
	}
	for _, goos := range []string{"windows", "darwin"} {
		t.Run(goos, func(t *testing.T) {
			t.Parallel()
			if err := typeCheckFor(goos, "amd64", "."); err != nil {
				t.Fatalf("GOOS=%s ./cmd/reliable-mqtt: %v", goos, err)
			}
		})
	}
}

// listedPackage is what typeCheckFor needs from `go list -json`.
type listedPackage struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	CgoFiles   []string
	ImportMap  map[string]string // import path as written -> package path (vendoring)
	Imports    []string          // package paths, after ImportMap
	Module     *struct{ GoVersion string }
	Error      *struct{ Err string }
}

// typeCheckFor type-checks pattern and everything it imports as built for
// goos/goarch, and returns the first type errors found (nil if none).
func typeCheckFor(goos, goarch, pattern string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-json=ImportPath,Dir,GoFiles,CgoFiles,ImportMap,Imports,Module,Error", pattern)
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []*listedPackage
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		p := new(listedPackage)
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("go list output: %v", err)
		}
		if p.Error != nil {
			return fmt.Errorf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		if len(p.CgoFiles) > 0 {
			return fmt.Errorf("%s needs cgo, which the release build turns off", p.ImportPath)
		}
		pkgs = append(pkgs, p)
	}

	// go list -deps prints every package after its imports: each package
	// waits for its imports' types, and GOMAXPROCS packages are checked
	// at once.
	type result struct {
		pkg  *types.Package
		done chan struct{}
	}
	results := map[string]*result{"unsafe": {pkg: types.Unsafe, done: closed()}}
	for _, p := range pkgs {
		if p.ImportPath != "unsafe" {
			results[p.ImportPath] = &result{done: make(chan struct{})}
		}
	}
	sizes := types.SizesFor("gc", goarch)
	var (
		mu     sync.Mutex
		errs   []string
		wg     sync.WaitGroup
		tokens = make(chan struct{}, runtime.GOMAXPROCS(0))
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, fmt.Sprintf(format, args...))
	}
	for _, p := range pkgs {
		if p.ImportPath == "unsafe" {
			continue
		}
		wg.Add(1)
		go func(p *listedPackage) {
			defer wg.Done()
			res := results[p.ImportPath]
			defer close(res.done)
			for _, imp := range p.Imports {
				if r, ok := results[imp]; ok {
					<-r.done
				}
			}
			tokens <- struct{}{}
			defer func() { <-tokens }()

			fset := token.NewFileSet()
			var files []*ast.File
			for _, name := range p.GoFiles {
				f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
				if err != nil {
					fail("%v", err)
					return
				}
				files = append(files, f)
			}
			conf := types.Config{
				Importer: importerFunc(func(path string) (*types.Package, error) {
					if mapped, ok := p.ImportMap[path]; ok {
						path = mapped
					}
					r, ok := results[path]
					if !ok || r.pkg == nil {
						return nil, fmt.Errorf("%s: no types for import %q", p.ImportPath, path)
					}
					return r.pkg, nil
				}),
				Sizes: sizes,
				Error: func(err error) { fail("%v", err) },
			}
			if p.Module != nil && p.Module.GoVersion != "" {
				conf.GoVersion = "go" + p.Module.GoVersion
			}
			pkg, _ := conf.Check(p.ImportPath, fset, files, nil)
			res.pkg = pkg
		}(p)
	}
	wg.Wait()
	if len(errs) > 0 {
		if len(errs) > 20 {
			errs = append(errs[:20], fmt.Sprintf("... and %d more", len(errs)-20))
		}
		return errors.New(strings.Join(errs, "\n"))
	}
	return nil
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
