package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// quickstart is one run of the README's quickstart command: the real
// binary in streams mode with the four shipped configs, on two embedded
// brokers under dir.
type quickstart struct {
	cmd  *exec.Cmd
	logs *harness.LogBuffer
	done chan struct{} // closed once the process has exited
}

// quickstartArgs is the README command after the binary's name.
func quickstartArgs(root string) []string {
	return []string{"streams", "--no-api",
		"-o", filepath.Join(root, "resources", "quickstart-root.yaml"),
		filepath.Join(root, "config", "publisher.yaml"),
		filepath.Join(root, "config", "bridge.yaml"),
		filepath.Join(root, "config", "consumer.yaml"),
		filepath.Join(root, "config", "consumer_report.yaml")}
}

func startQuickstart(t *testing.T, dir string, env ...string) *quickstart {
	t.Helper()
	q := &quickstart{logs: &harness.LogBuffer{}}
	q.cmd = exec.Command(harness.Binary(t), quickstartArgs(harness.ModuleRoot(t))...)
	q.cmd.Dir = dir
	q.cmd.Env = append(os.Environ(), env...)
	q.cmd.Stdout, q.cmd.Stderr = q.logs, q.logs
	// Bounds Wait: pipes a leftover child still holds are closed after this.
	q.cmd.WaitDelay = 5 * time.Second
	if err := q.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	q.done = done
	go func() { _ = q.cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = q.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = q.cmd.Process.Kill()
			<-done
			t.Errorf("the quickstart did not stop within 15 s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("quickstart log (pid %d):\n%s", q.cmd.Process.Pid, harness.TailLines(q.logs.String(), 80))
		}
	})
	return q
}

// log returns what the run printed so far, and fails the test if the
// process exited on its own.
func (q *quickstart) log(t *testing.T) string {
	t.Helper()
	select {
	case <-q.done:
		if q.cmd.ProcessState.ExitCode() != -1 { // -1: our SIGKILL
			t.Fatalf("the quickstart exited with code %d", q.cmd.ProcessState.ExitCode())
		}
	default:
	}
	return q.logs.String()
}

var (
	qsApplied = regexp.MustCompile(`applied event \w+: run (\S+) seq (\d+) `)
	qsPending = regexp.MustCompile(`Outbox \S*publisher-outbox\.db: [^;]*; (\d+) pending \(`)
	qsResume  = regexp.MustCompile(`outbox (\S+): resuming (\d+) pending records \((\d+) bytes\), oldest from \S+`)
	qsReport  = regexp.MustCompile(`run (\S+): applied (\d+) events \((\d+) duplicates skipped\); missing sequence numbers: ([^"]+)"`)
)

// TestQuickstartShowsRecoveryAfterKill9 runs the README's quickstart
// command, SIGKILLs it while readings are pending, starts it again and
// checks what the terminal shows: the outbox resuming its backlog, the
// consumer's resumed session, and per run "missing sequence numbers: none"
// with the applied count that the consumer's table really holds. The
// per-event log and the table are checked too: no reading applied twice,
// every reading of each run present from 1 up, and the publisher's outbox
// empty at the end (everything it stored was confirmed by the consumer).
//
// The backlog is made, not raced for: in the killed run the edge broker
// also listens on TCP and the bridge reads it through a proxy; once the
// chain has applied readings the proxy is cut, so the publisher's outbox
// can only grow (no ACK gets back), and the kill comes when it holds 20.
// The second run is the README's command with its default brokers.
func TestQuickstartShowsRecoveryAfterKill9(t *testing.T) {
	const perRun = 400
	dir := t.TempDir()
	env := []string{"PUBLISH_INTERVAL=2ms", fmt.Sprintf("PUBLISH_COUNT=%d", perRun), "STATS_INTERVAL=300ms", "REPORT_INTERVAL=1s"}

	edge := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	hop := harness.NewProxy(t, edge) // bridge ──▶ edge broker, cut below
	first := startQuickstart(t, dir,
		"PUBLISH_INTERVAL=2ms", "PUBLISH_COUNT=0", "STATS_INTERVAL=300ms", "REPORT_INTERVAL=1s",
		"EDGE_BROKER=embedded://?dir=./reliable-mqtt-data/edge&listen="+edge,
		"SOURCE_BROKER="+hop.URL())
	harness.Eventually(t, 60*time.Second, "20 readings applied", func() bool {
		return len(qsApplied.FindAllString(first.log(t), 20)) == 20
	})
	hop.Cut()
	cutAt := len(first.log(t))
	harness.Eventually(t, 60*time.Second, "20 readings pending in the publisher's outbox after the bridge was cut off", func() bool {
		ms := qsPending.FindAllStringSubmatch(first.log(t)[cutAt:], -1)
		if len(ms) == 0 {
			return false
		}
		n, _ := strconv.Atoi(ms[len(ms)-1][1])
		return n >= 20
	})
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the quickstart is still running 10 s after SIGKILL")
	}
	run1 := qsApplied.FindStringSubmatch(first.logs.String())[1]

	second := startQuickstart(t, dir, env...)
	outboxPath := filepath.Join(dir, "reliable-mqtt-data", "publisher-outbox.db")
	harness.Eventually(t, 30*time.Second, "the resume line of the publisher's outbox", func() bool {
		return qsResume.MatchString(second.log(t))
	})
	m := qsResume.FindStringSubmatch(second.logs.String())
	if got, want := realPath(m[1]), realPath(outboxPath); got != want {
		t.Errorf("resume line names %s, want the publisher's outbox %s", m[1], outboxPath)
	}
	if n, _ := strconv.Atoi(m[2]); n < 20 {
		t.Errorf("killed with at least 20 readings pending, yet the restart resumes %s records: %q", m[2], m[0])
	}
	harness.Eventually(t, 30*time.Second, "the consumer's resumed-session line", func() bool {
		return strings.Contains(second.log(t), `Resumed the session of client \"consumer-1\"`)
	})

	// Both runs complete: the second run generates perRun readings, the
	// first run's backlog drains, and the publisher's outbox empties.
	var reports map[string][]string
	harness.Eventually(t, 120*time.Second, "both runs reported with nothing missing and the outbox empty", func() bool {
		log := second.log(t)
		reports = map[string][]string{}
		for _, r := range qsReport.FindAllStringSubmatch(log, -1) {
			reports[r[1]] = r // the newest line per run
		}
		ms := qsPending.FindAllStringSubmatch(log, -1)
		if len(reports) < 2 || len(ms) == 0 || ms[len(ms)-1][1] != "0" {
			return false
		}
		for run, r := range reports {
			if r[4] != "none" || (run != run1 && r[2] != strconv.Itoa(perRun)) {
				return false
			}
		}
		return true
	})
	if len(reports) != 2 {
		t.Fatalf("report lines name %d runs, want 2: %v", len(reports), reports)
	}

	// Each (run, seq) was logged as applied at most once, over both runs.
	seen := map[string]bool{}
	for _, a := range qsApplied.FindAllStringSubmatch(first.logs.String()+second.logs.String(), -1) {
		k := a[1] + "/" + a[2]
		if seen[k] {
			t.Errorf("reading %s applied twice", k)
		}
		seen[k] = true
	}
	// The table the report reads: per run the sequence is 1..applied with
	// no gap, and the report's figure is the table's.
	applied := harness.Applied(t, filepath.Join(dir, "reliable-mqtt-data", "consumer.db"))
	for run, r := range reports {
		st := applied[run]
		if st.Count != st.Max || st.Min != 1 {
			t.Errorf("run %s in applied_events: %d rows, seq %d..%d: not 1..N without gaps", run, st.Count, st.Min, st.Max)
		}
		if r[2] != strconv.Itoa(st.Count) {
			t.Errorf("run %s: the report says %s applied, the table holds %d", run, r[2], st.Count)
		}
		t.Logf("%s", strings.TrimSuffix(r[0], `"`))
	}
	if _, ok := reports[run1]; !ok {
		t.Errorf("no report line for the killed run %s", run1)
	}
}

// realPath resolves symlinks (a temp dir may sit behind one); on error it
// returns p unchanged, and the comparison fails with both paths shown.
func realPath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}

// warnLine is a logfmt line at warning level or above, or a panic.
var warnLine = regexp.MustCompile(`(?m)^.*(level=(warn|warning|error|fatal)\b|panic:).*$`)

// TestQuickstartFirstScreenHasNoWarning runs the README's quickstart
// command as it stands in a fresh directory and waits, not for a time, but
// for what a new user waits for: readings applied and the first report
// line with nothing missing. Up to then no line may be a warning or an
// error: a clean start must not teach users to ignore warnings.
func TestQuickstartFirstScreenHasNoWarning(t *testing.T) {
	q := startQuickstart(t, t.TempDir())
	var log string
	harness.Eventually(t, 60*time.Second, "5 readings applied and a report line with nothing missing", func() bool {
		log = q.log(t)
		reports := qsReport.FindAllStringSubmatch(log, -1)
		return len(qsApplied.FindAllString(log, 5)) == 5 && len(reports) > 0 && reports[len(reports)-1][4] == "none"
	})
	if bad := warnLine.FindAllString(log, -1); len(bad) > 0 {
		t.Errorf("a clean start printed %d warning or error lines:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	if !strings.Contains(log, "embedded broker started") {
		t.Errorf("no 'embedded broker started' line: the broker's own line is what the first screen keeps")
	}
}
