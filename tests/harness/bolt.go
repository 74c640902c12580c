package harness

import (
	"os"
	"os/exec"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// WriteBolt creates or opens the bbolt file at path, runs fn in one update
// and closes it: a file shaped by hand, as damage and format tests need.
func WriteBolt(t *testing.T, path string, fn func(*bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestChild is a command that runs this test binary again with env added
// and no test selected: the package's TestMain sees its variable and plays
// the child (a process to SIGKILL, a second holder of a file lock).
func TestChild(env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	return cmd
}
