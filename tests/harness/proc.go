package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// ProcOptions adjust how RunPipeline starts the process.
type ProcOptions struct {
	// Env is added to the test's own environment (later entries win).
	Env []string
	// Args are extra CLI arguments after `-c <config>`.
	Args []string
	// Dir is the working directory; "" means a fresh t.TempDir().
	Dir string
	// Binary replaces the reliable-mqtt executable (default Binary(t)).
	// Tests of the harness itself use it to run a helper program.
	Binary string
}

// Proc is a reliable-mqtt process running one pipeline config. It can be
// killed and started again; all runs write to one log file.
type Proc struct {
	t       testing.TB
	exe     string
	args    []string
	env     []string
	dir     string
	logPath string

	restartable
}

// restartable is the current run of a process a test kills and starts
// again. mu guards it so that a chaos goroutine may kill or start it while
// the test reads Running, Pid or the log.
type restartable struct {
	mu      sync.Mutex
	proc    *child // the current run
	runs    int
	runFrom int64 // log offset where the current run's output starts
}

// current returns the current run and where its output starts.
func (r *restartable) current() (*child, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc, r.runFrom
}

// procStopTimeout bounds the graceful stop in Restart and at cleanup.
const procStopTimeout = 10 * time.Second

// topLevelHTTP finds a config's own http section.
var topLevelHTTP = regexp.MustCompile(`(?m)^http:`)

// RunPipeline writes yaml to a config file and starts
// `reliable-mqtt -c <file> <o.Args...>` with stdout and stderr going to a
// log file. The process is SIGKILLed at cleanup; if the test failed, the
// tail of its log is logged first.
func RunPipeline(t testing.TB, yaml string, o ProcOptions) *Proc {
	t.Helper()
	exe := o.Binary
	if exe == "" {
		exe = Binary(t)
	}
	tmp := t.TempDir()
	conf := filepath.Join(tmp, "pipeline.yaml")
	if err := os.WriteFile(conf, []byte(yaml), 0o644); err != nil {
		t.Fatalf("harness: write pipeline config %s: %v", conf, err)
	}
	dir := o.Dir
	if dir == "" {
		dir = filepath.Join(tmp, "work")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatalf("harness: create working dir: %v", err)
		}
	}
	args := []string{"-c", conf}
	if !topLevelHTTP.MatchString(yaml) {
		// Without an http section the binary listens on 127.0.0.1:4195 and
		// stops when that is taken (by another test's process): a free
		// port each. An -s http.address in o.Args still wins (it comes later).
		args = append(args, "-s", "http.address=127.0.0.1:0")
	}
	p := &Proc{
		t:       t,
		exe:     exe,
		args:    append(args, o.Args...),
		env:     append(os.Environ(), o.Env...),
		dir:     dir,
		logPath: filepath.Join(tmp, "pipeline.log"),
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s, last log lines:\n%s", p, tail(p.logPath, 60))
		}
		proc, _ := p.current()
		if proc == nil {
			return // never started
		}
		if err := proc.kill(); err != nil {
			t.Errorf("harness: cleanup: %v", err)
		}
	})
	p.start()
	return p
}

func (p *Proc) String() string {
	return fmt.Sprintf("process %s %s", filepath.Base(p.exe), strings.Join(p.args, " "))
}

func (p *Proc) start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.runs++
	marker := fmt.Sprintf("=== harness: start #%d: %s %s ===", p.runs, p.exe, strings.Join(p.args, " "))
	// The current run's output begins after the marker; record where.
	var runFrom int64
	if fi, err := os.Stat(p.logPath); err == nil {
		runFrom = fi.Size()
	}
	runFrom += int64(len(marker)) + 1
	proc, err := startChild(p.exe, p.args, p.env, p.dir, p.logPath, marker)
	if err != nil {
		p.t.Fatalf("harness: %v", err)
	}
	p.proc, p.runFrom = proc, runFrom
}

// Kill SIGKILLs the process (a real crash: no deferred code, no flush) and
// waits until it is gone.
func (p *Proc) Kill() {
	p.t.Helper()
	proc, _ := p.current()
	if err := proc.kill(); err != nil {
		p.t.Fatalf("harness: kill %s: %v", p, err)
	}
}

// Stop sends SIGTERM and waits up to timeout for a clean exit. A process
// still running then is SIGKILLed and Stop returns an error saying so.
func (p *Proc) Stop(timeout time.Duration) error {
	proc, _ := p.current()
	if err := proc.stop(timeout); err != nil {
		return fmt.Errorf("stop %s: %w", p, err)
	}
	return nil
}

// Restart starts the same command again as a new process. A run that is
// still alive is stopped first (SIGTERM, SIGKILL after 10 s).
func (p *Proc) Restart() {
	p.t.Helper()
	if p.Running() {
		if err := p.Stop(procStopTimeout); err != nil {
			p.t.Logf("harness: restart: %v", err)
		}
	}
	p.start()
}

// Wait waits up to timeout for the current run to exit and returns its
// exit code (-1 if a signal ended it). It returns an error if the process
// is still running at the timeout.
func (p *Proc) Wait(timeout time.Duration) (exitCode int, err error) {
	proc, _ := p.current()
	if !proc.wait(timeout) {
		return 0, fmt.Errorf("%s (pid %d) still running after %s", p, proc.pid(), timeout)
	}
	return proc.exitCode(), nil
}

// Log returns everything the process printed so far, over all runs, with a
// "=== harness: start #N ..." line before each run.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// RunLog returns what the current run printed so far.
func (p *Proc) RunLog() string {
	_, from := p.current()
	log := p.Log()
	if int64(len(log)) < from {
		return ""
	}
	return log[from:]
}

// LogPath is the file that collects the output of every run.
func (p *Proc) LogPath() string { return p.logPath }

// WaitForLog reports whether the current run prints substr within timeout.
// Output of earlier runs does not count, so after Restart it waits for the
// new process.
func (p *Proc) WaitForLog(substr string, timeout time.Duration) bool {
	return Poll(timeout, func() bool { return strings.Contains(p.RunLog(), substr) })
}

// Pid of the current run.
func (p *Proc) Pid() int {
	proc, _ := p.current()
	return proc.pid()
}

// Running reports whether the current run is alive.
func (p *Proc) Running() bool {
	proc, _ := p.current()
	return proc.running()
}
