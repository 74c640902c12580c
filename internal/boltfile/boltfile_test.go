package boltfile

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/failpoint"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// childHoldEnv makes the test binary act as another process that holds a file.
const childHoldEnv = "BOLTFILE_TEST_HOLD"

func TestMain(m *testing.M) {
	if path := os.Getenv(childCompactEnv); path != "" {
		os.Exit(compactChild(path))
	}
	if path := os.Getenv(childHoldEnv); path != "" {
		f, err := acquireT(path)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("ready")
		// Hold the file until the parent closes our stdin.
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		_ = f.Release()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestNewFileGetsMarkerAndAbsolutePath(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	f, err := acquireT("new.db")
	if err != nil {
		t.Fatal(err)
	}
	real, _ := filepath.EvalSymlinks(dir)
	if want := filepath.Join(real, "new.db"); f.Path() != want {
		t.Errorf("Path() = %q, want %q", f.Path(), want)
	}
	err = f.DB().View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(MarkerBucket))
		if b == nil {
			return errors.New("no marker bucket")
		}
		if got := string(b.Get([]byte(MarkerKey))); got != FormatV1 {
			return fmt.Errorf("marker = %q", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Release(); err != nil {
		t.Fatal(err)
	}
	// Reopening a file with the marker works.
	f, err = acquireT(filepath.Join(dir, "new.db"))
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Release()
}

// acquireT acquires path the way the outbox and ledger do: a new file is
// created with a bucket of its owner.
func acquireT(path string) (*File, error) {
	return AcquireWith(path, Options{Create: func(tx *bolt.Tx) error {
		_, err := tx.CreateBucket([]byte("owner"))
		return err
	}})
}

// TestNewFileHoldsItsBucketsAndNoLeftover: the owner's buckets are in the
// file from its first appearance at the path, and the temporary name is gone.
func TestNewFileHoldsItsBucketsAndNoLeftover(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new.db")
	// A leftover of a creation cut short is replaced, not reused.
	writeFile(t, newPath(path), []byte("half-written"))
	f, err := acquireT(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.View(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte("owner")) == nil || tx.Bucket([]byte(MarkerBucket)) == nil {
			return fmt.Errorf("buckets %v, want the marker and the owner's", bucketNames(tx))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(newPath(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file left behind: %v", err)
	}
}

// TestCreationKilledBeforeTheRenameLeavesNoFile: a process killed after
// writing the new file under its temporary name leaves nothing at the path,
// and the next start creates the file whole.
func TestCreationKilledBeforeTheRenameLeavesNoFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new.db")
	cmd := harness.TestChild(childHoldEnv+"="+path, failpoint.EnvVar+"="+failpoint.CreateWritten)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child: %v (want SIGKILL), output %q", err, out)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file is at the path after a kill before the rename: %v", err)
	}
	if _, err := os.Stat(newPath(path)); err != nil {
		t.Fatalf("the temporary file should be left by the kill: %v", err)
	}
	f, err := acquireT(path)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Release()
	if _, err := os.Stat(newPath(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("leftover not removed: %v", err)
	}
}

// TestFilesWithoutOurDataAreRefusedAsDamaged: an empty file, a file bbolt
// initialised and nothing committed to, and one with only the marker are
// what a power cut on a disk that ignores flushes leaves of a full file:
// refused as damaged, untouched, never taken for a new one.
func TestFilesWithoutOurDataAreRefusedAsDamaged(t *testing.T) {
	cases := map[string]func(path string){
		"empty":       func(path string) { writeFile(t, path, nil) },
		"no buckets":  func(path string) { harness.WriteBolt(t, path, func(*bolt.Tx) error { return nil }) },
		"marker only": func(path string) { harness.WriteBolt(t, path, func(tx *bolt.Tx) error { return writeMarker(tx) }) },
	}
	for name, make := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f.db")
			make(path)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = acquireT(path)
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "move the file aside") {
				t.Fatalf("err = %v, want a damaged-file refusal naming %s", err, path)
			}
			db, err := OpenReadOnly(path, time.Second)
			if err == nil {
				_ = db.Close()
			}
			if !errors.Is(err, ErrDamaged) {
				t.Fatalf("OpenReadOnly: %v, want ErrDamaged", err)
			}
			after, _ := os.ReadFile(path)
			if !bytes.Equal(before, after) {
				t.Fatal("a refused file was changed")
			}
		})
	}
}

func writeMarker(tx *bolt.Tx) error {
	b, err := tx.CreateBucket([]byte(MarkerBucket))
	if err != nil {
		return err
	}
	return b.Put([]byte(MarkerKey), []byte(FormatV1))
}

func TestSharedHandleIsReferenceCounted(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	a, err := acquireT(filepath.Join(dir, "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	// Another spelling of the same file, through a symlinked directory and
	// an unclean path, joins the same database instead of deadlocking.
	b, err := acquireT(link + "/./sub/../x.db")
	if err != nil {
		t.Fatal(err)
	}
	if a.DB() != b.DB() || a.Path() != b.Path() {
		t.Fatalf("two handles to one file got different databases: %s vs %s", a.Path(), b.Path())
	}
	if err := a.Release(); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(); err == nil {
		t.Error("second Release of one handle succeeded")
	}
	// b still works after a's release.
	if err := b.DB().Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists([]byte("still-open"))
		return err
	}); err != nil {
		t.Fatalf("database closed while a handle was still held: %v", err)
	}
	db := b.DB()
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(*bolt.Tx) error { return nil }); err == nil {
		t.Error("last Release did not close the database")
	}
}

func TestMissingDirectoryIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope", "x.db")
	_, err := acquireT(path)
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("err = %v, want a 'does not exist' error", err)
	}
	if _, statErr := os.Stat(filepath.Dir(path)); !errors.Is(statErr, os.ErrNotExist) {
		t.Error("Acquire created the missing directory")
	}
}

// refuseCase builds a file that Acquire must refuse.
type refuseCase struct {
	name string
	make func(t *testing.T, path string)
	want []string // substrings of the error
}

func TestForeignAndDamagedFilesAreRefusedUntouched(t *testing.T) {
	cases := []refuseCase{
		{
			name: "bolt file of another program",
			make: func(t *testing.T, path string) {
				harness.WriteBolt(t, path, func(tx *bolt.Tx) error {
					for _, n := range []string{"x", "y"} {
						if _, err := tx.CreateBucket([]byte(n)); err != nil {
							return err
						}
					}
					return nil
				})
			},
			want: []string{"not a reliable-mqtt file", "buckets [x y] and no format marker", "refusing"},
		},
		{
			name: "other format version",
			make: func(t *testing.T, path string) {
				harness.WriteBolt(t, path, func(tx *bolt.Tx) error {
					b, err := tx.CreateBucket([]byte(MarkerBucket))
					if err != nil {
						return err
					}
					return b.Put([]byte(MarkerKey), []byte("reliable-mqtt/9"))
				})
			},
			want: []string{`"reliable-mqtt/9"`, "written in a newer format", "refusing to use it", "format version 9", "reads versions 1 to 1", "run the release that wrote it, or a newer one"},
		},
		{
			name: "marker of another program",
			make: func(t *testing.T, path string) {
				harness.WriteBolt(t, path, func(tx *bolt.Tx) error {
					b, err := tx.CreateBucket([]byte(MarkerBucket))
					if err != nil {
						return err
					}
					return b.Put([]byte(MarkerKey), []byte("other/2"))
				})
			},
			want: []string{"not a reliable-mqtt file", `"other/2"`},
		},
		{
			name: "marker bucket without key",
			make: func(t *testing.T, path string) {
				harness.WriteBolt(t, path, func(tx *bolt.Tx) error {
					_, err := tx.CreateBucket([]byte(MarkerBucket))
					return err
				})
			},
			want: []string{"not a reliable-mqtt file", "no \"format\" key"},
		},
		{
			name: "random bytes",
			make: func(t *testing.T, path string) {
				buf := make([]byte, 64<<10)
				_, _ = rand.Read(buf)
				writeFile(t, path, buf)
			},
			want: []string{"not a usable bbolt database", "invalid database"},
		},
		{
			name: "text file",
			make: func(t *testing.T, path string) {
				writeFile(t, path, []byte("# my notes\nthis is not a database\n"))
			},
			want: []string{"not a usable bbolt database", "invalid database"},
		},
		{
			name: "our file truncated to its first page",
			make: func(t *testing.T, path string) {
				makeOurs(t, path)
				truncate(t, path, 4096)
			},
			want: []string{"truncated"},
		},
		{
			name: "10 bytes",
			make: func(t *testing.T, path string) {
				writeFile(t, path, []byte("0123456789"))
			},
			want: []string{"not a usable bbolt database", "invalid database"},
		},
		{
			name: "our file truncated to 100 bytes",
			make: func(t *testing.T, path string) {
				makeOurs(t, path)
				truncate(t, path, 100)
			},
			want: []string{"truncated"},
		},
		{
			name: "our file truncated below its high-water mark",
			make: func(t *testing.T, path string) {
				used := makeOurs(t, path)
				truncate(t, path, used/2)
			},
			want: []string{"truncated"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f.db")
			c.make(t, path)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			f, err := acquireT(path)
			if err == nil {
				_ = f.Release()
				t.Fatal("Acquire accepted the file")
			}
			msg := err.Error()
			if !strings.Contains(msg, path) {
				t.Errorf("error does not name the file: %v", err)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Errorf("refused file changed: %d bytes before, %d after", len(before), len(after))
			}
			// A refused file leaves nothing registered or locked: a second
			// attempt gives the same answer rather than "locked".
			if _, err2 := acquireT(path); err2 == nil || errors.Is(err2, ErrLocked) {
				t.Errorf("second attempt: %v", err2)
			}
		})
	}
}

func TestFileLockedByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "held.db")
	cmd := harness.TestChild(childHoldEnv + "=" + path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "ready" {
			t.Fatalf("child: %q", s)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("child did not acquire the file in 20s")
	}

	done := make(chan error, 1)
	go func() {
		f, err := acquireT(path)
		if err == nil {
			_ = f.Release()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), path) ||
			!strings.Contains(err.Error(), "only one process may own it") {
			t.Fatalf("err = %v, want a 'locked by another process' error naming the file", err)
		}
	case <-time.After(lockTimeout + 20*time.Second):
		t.Fatal("Acquire of a file held by another process did not return")
	}

	// Once the other process lets go, the file opens.
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	f, err := acquireT(path)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Release()
}

// makeOurs writes a reliable-mqtt file with some data and returns the size
// its metadata says it uses.
func makeOurs(t *testing.T, path string) int64 {
	t.Helper()
	f, err := acquireT(path)
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	err = f.DB().Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("data"))
		if err != nil {
			return err
		}
		for i := 0; i < 500; i++ {
			if err := b.Put([]byte(fmt.Sprintf("k%05d", i)), bytes.Repeat([]byte{'v'}, 1000)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = f.DB().View(func(tx *bolt.Tx) error { used = tx.Size(); return nil })
	if err := f.Release(); err != nil {
		t.Fatal(err)
	}
	return used
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func truncate(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}
