package imports

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// maxTracked bounds a tracked file: every clone and CI run fetches it.
const maxTracked = 1 << 20

// keptFixtures names tracked files allowed past the two rules below (a
// binary test input, say), each with the reason it is kept. Empty today.
var keptFixtures = map[string]string{}

// executableMagic opens an executable or object file of the platforms Go
// builds for: ELF, Mach-O (32/64-bit, both byte orders, universal), PE and
// WebAssembly.
var executableMagic = [][]byte{
	[]byte("\x7fELF"),
	{0xfe, 0xed, 0xfa, 0xce}, {0xce, 0xfa, 0xed, 0xfe},
	{0xfe, 0xed, 0xfa, 0xcf}, {0xcf, 0xfa, 0xed, 0xfe},
	{0xca, 0xfe, 0xba, 0xbe},
	[]byte("MZ"),
	[]byte("\x00asm"),
}

// TestNoTrackedBinaryOrLargeFile fails on a tracked file that is an
// executable binary or larger than 1 MB: build outputs belong in
// .gitignore, not in the history every checkout downloads.
func TestNoTrackedBinaryOrLargeFile(t *testing.T) {
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v (this test needs the Git checkout)", err)
	}
	files := bytes.Split(bytes.TrimRight(out, "\x00"), []byte{0})
	if len(files) < 100 {
		t.Fatalf("git ls-files listed %d files: not the repository", len(files))
	}
	for _, f := range files {
		name := string(f)
		if _, ok := keptFixtures[name]; ok {
			continue
		}
		path := filepath.Join(root(t), name)
		fi, err := os.Lstat(path)
		if os.IsNotExist(err) {
			continue // deleted in the worktree, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		if fi.Size() > maxTracked {
			t.Errorf("%s is tracked and has %d bytes (at most %d): build it, don't commit it", name, fi.Size(), maxTracked)
		}
		if isExecutable(t, path) {
			t.Errorf("%s is a tracked executable binary: remove it and list it in .gitignore", name)
		}
	}
}

func isExecutable(t *testing.T, path string) bool {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, 4)
	n, _ := f.Read(head)
	for _, m := range executableMagic {
		if n >= len(m) && bytes.Equal(head[:len(m)], m) {
			return true
		}
	}
	return false
}

func TestExecutableMagicIsRecognised(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if !isExecutable(t, self) {
		t.Fatalf("the test binary %s is not recognised as an executable", self)
	}
	if isExecutable(t, filepath.Join(root(t), "go.mod")) {
		t.Fatal("go.mod is taken for an executable")
	}
}
