package boltfile

import (
	"bytes"
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

// childCompactEnv makes the test binary a process that opens the file named
// by it (compacting it if sparse), with failpoints from the environment.
const childCompactEnv = "BOLTFILE_TEST_COMPACT"

const testCompactMinFree = 1 << 20

func compactChild(path string) int {
	compactMinFree = testCompactMinFree
	f, err := acquireT(path)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Printf("opened compacted=%v\n", f.Compacted())
	if err := f.Release(); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	return 0
}

// makeSparse writes a file shaped like an outbox and a ledger sharing it
// (records with a bucket sequence, an index, a nested bucket), then deletes
// 90% of the records, and returns its size.
func makeSparse(t *testing.T, path string) int64 {
	t.Helper()
	f, err := acquireT(path)
	if err != nil {
		t.Fatal(err)
	}
	val := bytes.Repeat([]byte("v"), 200)
	for chunk := 0; chunk < 4; chunk++ {
		err := f.Update(func(tx *bolt.Tx) error {
			rec, err := tx.CreateBucketIfNotExists([]byte("outbox/records"))
			if err != nil {
				return err
			}
			ids, err := tx.CreateBucketIfNotExists([]byte("outbox/ids"))
			if err != nil {
				return err
			}
			led, err := tx.CreateBucketIfNotExists([]byte("ledger"))
			if err != nil {
				return err
			}
			seen, err := led.CreateBucketIfNotExists([]byte("seen"))
			if err != nil {
				return err
			}
			for i := 0; i < 5000; i++ {
				seq, _ := rec.NextSequence()
				k := []byte(fmt.Sprintf("%016x", seq))
				if err := rec.Put(k, val); err != nil {
					return err
				}
				if err := ids.Put([]byte(fmt.Sprintf("id-%d", seq)), k); err != nil {
					return err
				}
				if seq%100 == 0 {
					if err := seen.Put(k, []byte("applied")); err != nil {
						return err
					}
				}
			}
			return led.SetSequence(uint64(42 + chunk))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	err = f.Update(func(tx *bolt.Tx) error {
		rec, ids := tx.Bucket([]byte("outbox/records")), tx.Bucket([]byte("outbox/ids"))
		for seq := uint64(1); seq <= 18000; seq++ {
			if err := rec.Delete([]byte(fmt.Sprintf("%016x", seq))); err != nil {
				return err
			}
			if err := ids.Delete([]byte(fmt.Sprintf("id-%d", seq))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Release(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// snapshot lists every bucket (with its sequence) and every key and value.
func snapshot(t *testing.T, f *File) string {
	t.Helper()
	var sb strings.Builder
	var walk func(prefix string, b *bolt.Bucket) error
	walk = func(prefix string, b *bolt.Bucket) error {
		fmt.Fprintf(&sb, "bucket %s seq=%d\n", prefix, b.Sequence())
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(prefix+"/"+string(k), b.Bucket(k))
			}
			fmt.Fprintf(&sb, "%s %q=%q\n", prefix, k, v)
			return nil
		})
	}
	err := f.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(string(name), b) })
	})
	if err != nil {
		t.Fatal(err)
	}
	return sb.String()
}

func TestFileBelowTheFreeThresholdIsNotCompacted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	size := makeSparse(t, path) // about 6 MiB free, below the default 16 MiB
	f, err := acquireT(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Compacted() {
		t.Fatal("compacted a file with less free space than compactMinFree")
	}
	if err := f.Release(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != size {
		t.Fatalf("size %v (%v), want %d unchanged", st.Size(), err, size)
	}
}

// TestCompactionSurvivesSIGKILLAtEveryStep kills a process at each step of
// a compaction and checks the next open finds every bucket, key, value and
// sequence of the original, no leftover copy, and a small file.
func TestCompactionSurvivesSIGKILLAtEveryStep(t *testing.T) {
	src := filepath.Join(t.TempDir(), "sparse.db")
	sizeBefore := makeSparse(t, src)
	orig, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	f, err := acquireT(src)
	if err != nil {
		t.Fatal(err)
	}
	want := snapshot(t, f)
	if err := f.Release(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(want, "ledger/seen") || !strings.Contains(want, "bucket ledger seq=45") {
		t.Fatalf("test file lacks the nested bucket or the sequence:\n%.300s", want)
	}

	defer func(v int64) { compactMinFree = v }(compactMinFree)
	compactMinFree = testCompactMinFree
	for _, point := range []string{"", failpoint.CompactCopied, failpoint.CompactRenamed, failpoint.CompactDone} {
		t.Run("kill-at="+point, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out.db")
			if err := os.WriteFile(path, orig, 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := runCompactChild(t, path, point)
			if point == "" {
				if err != nil || !strings.Contains(out, "opened compacted=true") {
					t.Fatalf("child: %v, output %q", err, out)
				}
			} else {
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Fatalf("child at %s: %v (want SIGKILL), output %q", point, err, out)
				}
			}
			f, err := acquireT(path)
			if err != nil {
				t.Fatal(err)
			}
			got := snapshot(t, f)
			if err := f.Release(); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("after a kill at %q the file's contents differ from the original's (%d vs %d bytes of listing)", point, len(got), len(want))
			}
			if _, err := os.Stat(compactPath(path)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("leftover %s: %v", compactPath(path), err)
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Size()*2 > sizeBefore {
				t.Fatalf("file is %d bytes after compaction, was %d: not compacted", st.Size(), sizeBefore)
			}
		})
	}
}

func runCompactChild(t *testing.T, path, point string) (string, error) {
	t.Helper()
	cmd := harness.TestChild(childCompactEnv+"="+path, failpoint.EnvVar+"="+point)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
		return string(out), err
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("child did not finish in 2 minutes: %s", out)
		return "", nil
	}
}

// TestFailedCompactionKeepsTheFile makes the copy impossible (its path is a
// non-empty directory) and checks the open still succeeds on the original.
func TestFailedCompactionKeepsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	size := makeSparse(t, path)
	f, err := acquireT(path)
	if err != nil {
		t.Fatal(err)
	}
	want := snapshot(t, f)
	if err := f.Release(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(compactPath(path), "in-the-way"), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(v int64) { compactMinFree = v }(compactMinFree)
	compactMinFree = testCompactMinFree
	f, err = acquireT(path)
	if err != nil {
		t.Fatalf("open with a failing compaction: %v", err)
	}
	defer f.Release()
	if f.Compacted() {
		t.Fatal("Compacted() = true although the copy could not be written")
	}
	if err := f.CompactionSkipped(); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("CompactionSkipped() = %v, want the copy's error naming %s", err, path)
	}
	if got := snapshot(t, f); got != want {
		t.Fatal("contents changed by a failed compaction")
	}
	if st, err := os.Stat(path); err != nil || st.Size() != size {
		t.Fatalf("size %v (%v), want %d unchanged", st.Size(), err, size)
	}
}
