package damage

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// noData builds, at path, what a power cut on a disk that ignores flushes
// can leave where a full outbox or ledger was: a file with none of our data.
var noData = map[string]func(t *testing.T, path string){
	"empty file": func(t *testing.T, path string) {
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	},
	"bbolt file without buckets": func(t *testing.T, path string) { harness.WriteBolt(t, path, func(*bolt.Tx) error { return nil }) },
	"format marker only": func(t *testing.T, path string) {
		harness.WriteBolt(t, path, func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket([]byte("reliable-mqtt"))
			if err != nil {
				return err
			}
			return b.Put([]byte("format"), []byte("reliable-mqtt/1"))
		})
	},
}

// TestFileWithoutOurDataIsRefusedAtStart: such a file at a configured
// outbox or ledger path stops the process at start with the damaged-file
// message naming it, and is left as it was; it is never taken for a new,
// empty outbox (a silent total loss). A missing file is still created.
func TestFileWithoutOurDataIsRefusedAtStart(t *testing.T) {
	for name, make := range noData {
		for _, component := range []string{"outbox", "ledger"} {
			t.Run(component+"/"+name, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), component+".db")
				make(t, path)
				before, _ := os.ReadFile(path)
				var p *harness.Proc
				if component == "outbox" {
					p = harness.RunPipeline(t, drainConfig("tcp://127.0.0.1:1", path, "127.0.0.1:0", "auto"), harness.ProcOptions{})
				} else {
					p = runLedger(t, path)
				}
				if !harness.Poll(runWait, func() bool { return !p.Running() }) {
					t.Fatalf("the process still runs %s after starting on a file without data", runWait)
				}
				checkNoCrash(t, p)
				line := refusal(p.RunLog(), path)
				if !strings.Contains(line, "is damaged") || !strings.Contains(line, "move the file aside") {
					t.Fatalf("no damaged-file refusal naming %s in the log:\n%s", path, p.RunLog())
				}
				if strings.Contains(p.RunLog(), "PASSED evt-") {
					t.Fatal("the ledger applied events on a file without data")
				}
				if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
					t.Fatal("the refused file was changed")
				}
				t.Logf("refused: %s", line)
			})
		}
	}
	t.Run("missing file is created", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ledger.db")
		p := runLedger(t, path)
		if n := strings.Count(p.RunLog(), "PASSED evt-"); n != records {
			t.Fatalf("a new ledger applied %d of %d events:\n%s", n, records, p.RunLog())
		}
		if _, err := os.Stat(path + ".new"); !os.IsNotExist(err) {
			t.Fatalf("temporary file left behind: %v", err)
		}
	})
}

// TestStatExitsNonZeroOnADamagedFile: `outbox stat` and `ledger stat`
// verify the file before they print counters; on a damaged file (or one
// without data) they name it and exit non-zero, and on the intact file
// they exit 0 and say what they verified.
func TestStatExitsNonZeroOnADamagedFile(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.db")
	writeOutbox(t, base)
	if out, code := stat(t, "outbox", base); code != 0 || !strings.Contains(out, "verified:") {
		t.Fatalf("outbox stat on the intact file: exit %d\n%s", code, out)
	}
	baseBytes, _ := os.ReadFile(base)
	keys := map[string]bool{}
	for k := range storedRecords(t, base, dir) {
		keys[k] = true
	}
	leaves := leavesHolding(baseBytes, keys)
	// Variants whose damage no reader can miss. (A changed branch pointer
	// can land on a stale copy of the same records: a file read whole.)
	sure := map[string]bool{
		"leaf element count lowered": true, "leaf page zeroed": true,
		"both meta pages zeroed": true, "truncated to half its used pages": true, "truncated inside its last used page": true,
	}
	n := 0
	for i, v := range variants() {
		if !sure[v.name] {
			continue
		}
		n++
		t.Run(v.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "outbox.db")
			damaged(t, v, base, path, uint64(200+i), leaves)
			out, code := stat(t, "outbox", path)
			if code == 0 || !strings.Contains(out, path) {
				t.Fatalf("outbox stat on a damaged file: exit %d, want non-zero naming the file:\n%s", code, out)
			}
			t.Logf("exit %d: %s", code, strings.TrimSpace(out))
		})
	}
	if n != len(sure) {
		t.Fatalf("ran %d variants, want %d", n, len(sure))
	}
	for name, make := range noData {
		t.Run("no data/"+name, func(t *testing.T) {
			for _, cmd := range []string{"outbox", "ledger"} {
				path := filepath.Join(t.TempDir(), "f.db")
				make(t, path)
				out, code := stat(t, cmd, path)
				if code == 0 || !strings.Contains(out, "is damaged") {
					t.Fatalf("%s stat on a file without data: exit %d\n%s", cmd, code, out)
				}
			}
		})
	}
}

// stat runs `reliable-mqtt <what> stat path` and returns its output and
// exit code.
func stat(t *testing.T, what, path string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, harness.Binary(t), what, "stat", path).CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		t.Fatalf("%s stat: %v", what, err)
	}
	return string(out), 0
}
