package outbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// The test binary re-executes itself as a child process in these modes.
const (
	childModeEnv = "OUTBOX_TEST_CHILD"
	childPathEnv = "OUTBOX_TEST_PATH"

	childAppend = "append" // append forever from 8 goroutines, print each seq
	childHold   = "hold"   // open the outbox, print "ready", wait for stdin EOF
	childFsize  = "fsize"  // append until RLIMIT_FSIZE stops the file growing

	// noTmpfsEnv forces the full-disk test onto its RLIMIT_FSIZE fallback.
	noTmpfsEnv = "OUTBOX_TEST_NO_TMPFS"
)

func runChild(mode, path string) int {
	switch mode {
	case childAppend:
		o, err := Open(path, Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					id := fmt.Sprintf("w%d-%d", w, i)
					r, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: id, Topic: "t", Payload: []byte(id)}})
					if err != nil {
						fmt.Fprintln(os.Stderr, err)
						os.Exit(1)
					}
					// One write per line: lines from different goroutines never interleave.
					_, _ = os.Stdout.WriteString(strconv.FormatUint(r.Seq, 10) + " " + id + "\n")
				}
			}()
		}
		wg.Wait()
		return 0
	case childHold:
		o, err := Open(path, Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = o.Close()
		return 0
	case childFsize:
		return appendUntilFileLimit(path)
	}
	fmt.Fprintln(os.Stderr, "unknown child mode", mode)
	return 2
}

// startChild runs the test binary in mode and returns it with its stdout.
func startChild(t *testing.T, mode, path string) (*exec.Cmd, io.WriteCloser, *bufio.Reader) {
	t.Helper()
	cmd := harness.TestChild(childModeEnv+"="+mode, childPathEnv+"="+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, stdin, bufio.NewReader(stdout)
}

// readLine reads one line from r, giving up after timeout.
func readLine(t *testing.T, r *bufio.Reader, timeout time.Duration) (string, error) {
	t.Helper()
	type result struct {
		s   string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := r.ReadString('\n')
		ch <- result{s, err}
	}()
	select {
	case res := <-ch:
		return res.s, res.err
	case <-time.After(timeout):
		return "", fmt.Errorf("no line from child within %s", timeout)
	}
}

func TestSIGKILLedWriterLosesNoAcknowledgedRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	cmd, _, out := startChild(t, childAppend, path)

	acked := map[uint64]string{}
	for len(acked) < 400 {
		line, err := readLine(t, out, 20*time.Second)
		if err != nil {
			t.Fatalf("after %d acked appends: %v", len(acked), err)
		}
		var seq uint64
		var id string
		if _, err := fmt.Sscanf(line, "%d %s", &seq, &id); err != nil {
			t.Fatalf("child line %q: %v", line, err)
		}
		acked[seq] = id
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v", err)
	}
	// Lines written before the kill but not yet read count too.
	for i := 0; i < 100000; i++ {
		line, err := out.ReadString('\n')
		if err != nil {
			break // EOF; a partial last line is not an acknowledgement
		}
		var seq uint64
		var id string
		if _, err := fmt.Sscanf(line, "%d %s", &seq, &id); err == nil {
			acked[seq] = id
		}
	}

	o := openT(t, path, Options{})
	stored := map[uint64]string{}
	for _, r := range readAll(t, o) {
		stored[r.Seq] = r.EventID
	}
	if o.Stats().Pending != len(stored) {
		t.Errorf("Stats.Pending = %d, records = %d", o.Stats().Pending, len(stored))
	}
	for seq, id := range acked {
		if stored[seq] != id {
			t.Errorf("acknowledged seq %d (%s) missing after SIGKILL (found %q)", seq, id, stored[seq])
		}
	}
	t.Logf("%d acknowledged appends, %d records after SIGKILL", len(acked), len(stored))
}

func TestFileLockedByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	_, stdin, out := startChild(t, childHold, path)
	if line, err := readLine(t, out, 20*time.Second); err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("child: %q %v", line, err)
	}
	done := make(chan error, 1)
	go func() {
		o, err := Open(path, Options{})
		if err == nil {
			_ = o.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "locked by another process") || !strings.Contains(err.Error(), path) {
			t.Fatalf("Open of a file another process holds: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Open of a file another process holds did not return")
	}
	_ = stdin.Close()
}

func TestFullDiskFailsAppendAndKeepsEarlierRecords(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	err := errors.New(noTmpfsEnv + " is set")
	if os.Getenv(noTmpfsEnv) == "" {
		err = syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m")
	}
	if err != nil {
		t.Logf("cannot mount a tmpfs (%v); using RLIMIT_FSIZE in a child process", err)
		fullDiskByFileLimit(t, filepath.Join(dir, "out.db"))
		return
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	path := filepath.Join(dir, "out.db")
	o, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()

	payload := strings.Repeat("x", 4000)
	var acked []Record
	var appendErr error
	for i := 0; i < 2000; i++ {
		r, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "t", Payload: []byte(payload)}})
		if err != nil {
			appendErr = err
			break
		}
		acked = append(acked, r)
	}
	if appendErr == nil {
		t.Fatal("2000 appends of 4 kB fitted on a 2 MB tmpfs")
	}
	if !strings.Contains(appendErr.Error(), path) {
		t.Errorf("append error does not name the file: %v", appendErr)
	}
	t.Logf("disk full after %d appends: %v", len(acked), appendErr)
	if st := o.Stats(); st.Pending != len(acked) {
		t.Errorf("Stats.Pending = %d after a failed commit, want %d", st.Pending, len(acked))
	}
	if got := readAll(t, o); len(got) != len(acked) {
		t.Errorf("in-process read after failure: %d records, want %d", len(got), len(acked))
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopen on the still-full disk: nothing lost, nothing half-written.
	o2 := openT(t, path, Options{})
	got := readAll(t, o2)
	if len(got) != len(acked) || o2.Stats().Pending != len(acked) {
		t.Fatalf("after reopen: %d records, Stats %+v; want %d", len(got), o2.Stats(), len(acked))
	}
	for i, r := range got {
		if r.Seq != acked[i].Seq || r.EventID != acked[i].EventID {
			t.Fatalf("record %d = %d/%s, want %d/%s", i, r.Seq, r.EventID, acked[i].Seq, acked[i].EventID)
		}
	}
	// The sender can still drain a full disk, and then appends work again.
	if err := o2.Remove(seqsOf(got[:len(got)/2])...); err != nil {
		t.Fatalf("Remove on a full disk: %v", err)
	}
	if _, err := o2.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "after", Topic: "t", Payload: []byte(payload)}}); err != nil {
		t.Fatalf("Append after draining: %v", err)
	}
}

// appendUntilFileLimit is the child side of the RLIMIT_FSIZE variant: it
// prints each acknowledged seq, then "failed: <error>" once the limit stops
// the file growing.
func appendUntilFileLimit(path string) int {
	o, err := Open(path, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st, err := os.Stat(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Writes past the limit fail with EFBIG instead of killing us.
	signal.Ignore(syscall.SIGXFSZ)
	lim := syscall.Rlimit{Cur: uint64(st.Size()) + 1<<20, Max: uint64(st.Size()) + 1<<20}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	payload := strings.Repeat("x", 4000)
	for i := 0; i < 5000; i++ {
		r, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "t", Payload: []byte(payload)}})
		if err != nil {
			fmt.Printf("failed: %v\n", err)
			_ = o.Close()
			return 0
		}
		fmt.Printf("%d\n", r.Seq)
	}
	fmt.Println("no failure")
	return 0
}

func fullDiskByFileLimit(t *testing.T, path string) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	cmd, _, out := startChild(t, childFsize, path)
	var acked []uint64
	for i := 0; i < 10000; i++ {
		line, err := readLine(t, out, 30*time.Second)
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "failed: ") {
			if !strings.Contains(line, path) {
				t.Errorf("append error does not name the file: %s", line)
			}
			t.Logf("file limit hit after %d appends: %s", len(acked), line)
			break
		}
		seq, err := strconv.ParseUint(line, 10, 64)
		if err != nil {
			t.Fatalf("child line %q", line)
		}
		acked = append(acked, seq)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	o := openT(t, path, Options{})
	got := readAll(t, o)
	if len(got) != len(acked) {
		t.Fatalf("after reopen: %d records, want %d", len(got), len(acked))
	}
	for i, r := range got {
		if r.Seq != acked[i] {
			t.Fatalf("record %d has seq %d, want %d", i, r.Seq, acked[i])
		}
	}
}
