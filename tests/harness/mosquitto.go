package harness

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MosquittoOptions configure a broker started by StartMosquitto.
type MosquittoOptions struct {
	// Port to listen on (127.0.0.1 only); 0 picks a free port.
	Port int
	// Persistence keeps sessions and queued messages in a directory of the
	// broker's own across Stop/Start. Enough for graceful restarts.
	Persistence bool
	// DurableOnKill saves to disk after every change (autosave_on_changes
	// true, autosave_interval 1). With the default autosave_interval of 1800
	// s a SIGKILLed mosquitto loses queued messages and sessions, so every
	// test that Kills the broker needs this. Implies Persistence.
	DurableOnKill bool
	// MaxInflight sets max_inflight_messages; 0 keeps mosquitto's 20.
	MaxInflight int
	// MaxQueued sets max_queued_messages; 0 means 1,000,000. Mosquitto's
	// default of 1000 silently drops the newest messages queued for an
	// offline session, which would make tests measure the broker's limit.
	MaxQueued int
	// Extra lines appended to the generated config.
	Extra string
}

// defaultMaxQueued is large enough that no test hits it by accident.
const defaultMaxQueued = 1_000_000

// brokerStartTimeout bounds how long a broker may take to accept
// connections, including loading a persistence file.
const brokerStartTimeout = 10 * time.Second

// brokerStopTimeout bounds a graceful stop (which saves the database).
const brokerStopTimeout = 10 * time.Second

// Mosquitto is a mosquitto process on 127.0.0.1 that a test can stop, kill
// and start again on the same port with the same persistence directory.
type Mosquitto struct {
	t       testing.TB
	exe     string
	port    int
	dir     string // holds the config, the log and data/
	conf    string
	logPath string

	restartable // its proc is nil before the first start
}

// StartMosquitto writes a config for o, starts mosquitto and waits until it
// accepts TCP connections. The broker is SIGKILLed at cleanup; if the test
// failed, the tail of its log is logged first.
func StartMosquitto(t testing.TB, o MosquittoOptions) *Mosquitto {
	t.Helper()
	exe := mosquittoPath(t)
	port := o.Port
	if port == 0 {
		port = FreePort(t)
	}
	dir := t.TempDir()
	m := &Mosquitto{
		t:       t,
		exe:     exe,
		port:    port,
		dir:     dir,
		conf:    filepath.Join(dir, "mosquitto.conf"),
		logPath: filepath.Join(dir, "mosquitto.log"),
	}
	if err := os.WriteFile(m.conf, []byte(mosquittoConfig(o, port, dir)), 0o644); err != nil {
		t.Fatalf("harness: write mosquitto config %s: %v", m.conf, err)
	}
	if o.Persistence || o.DurableOnKill {
		if err := os.MkdirAll(m.PersistenceDir(), 0o755); err != nil {
			t.Fatalf("harness: create mosquitto persistence dir: %v", err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("mosquitto on port %d, last log lines:\n%s", m.port, m.LogTail(40))
		}
		if proc, _ := m.current(); proc != nil {
			if err := proc.kill(); err != nil {
				t.Errorf("harness: cleanup of mosquitto on port %d: %v", m.port, err)
			}
		}
	})
	m.Start()
	return m
}

// mosquittoPath finds the mosquitto executable: $MOSQUITTO_BIN, PATH, then
// Debian's /usr/sbin (not on every user's PATH).
func mosquittoPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("MOSQUITTO_BIN"); p != "" {
		return p
	}
	if p, err := exec.LookPath("mosquitto"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/mosquitto"); err == nil {
		return "/usr/sbin/mosquitto"
	}
	t.Fatal("harness: mosquitto not found on PATH or at /usr/sbin/mosquitto; install mosquitto: apt-get install -y mosquitto")
	return ""
}

func mosquittoConfig(o MosquittoOptions, port int, dir string) string {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	line("listener %d 127.0.0.1", port)
	line("allow_anonymous true")
	// Without it a stop-and-wait client waits ~40 ms per round trip (Nagle).
	line("set_tcp_nodelay true")
	line("log_dest file %s", filepath.Join(dir, "mosquitto.log"))
	for _, lt := range []string{"error", "warning", "notice", "information"} {
		line("log_type %s", lt)
	}
	line("connection_messages true")
	line("log_timestamp_format %%Y-%%m-%%dT%%H:%%M:%%S")
	if os.Geteuid() == 0 {
		// As root mosquitto drops to user "mosquitto", which cannot write to
		// the test's temp dir.
		line("user root")
	}
	if o.Persistence || o.DurableOnKill {
		line("persistence true")
		line("persistence_location %s/", filepath.Join(dir, "data"))
	}
	if o.DurableOnKill {
		line("autosave_on_changes true")
		line("autosave_interval 1")
	}
	if o.MaxInflight > 0 {
		line("max_inflight_messages %d", o.MaxInflight)
	}
	maxQueued := o.MaxQueued
	if maxQueued == 0 {
		maxQueued = defaultMaxQueued
	}
	line("max_queued_messages %d", maxQueued)
	if o.Extra != "" {
		line("%s", o.Extra)
	}
	return b.String()
}

// URL is the broker's address for paho and for pipeline configs.
func (m *Mosquitto) URL() string { return "tcp://" + m.Addr() }

// Addr is host:port of the broker.
func (m *Mosquitto) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port)) }

// Port the broker listens on; it stays the same across restarts.
func (m *Mosquitto) Port() int { return m.port }

// PersistenceDir is where the broker keeps mosquitto.db (when persistent).
func (m *Mosquitto) PersistenceDir() string { return filepath.Join(m.dir, "data") }

// Pid of the running broker, 0 if it is not running.
func (m *Mosquitto) Pid() int {
	proc, _ := m.current()
	if proc == nil || !proc.running() {
		return 0
	}
	return proc.pid()
}

// Running reports whether the broker process is alive.
func (m *Mosquitto) Running() bool {
	proc, _ := m.current()
	return proc != nil && proc.running()
}

// Start starts the broker again on the same port and persistence dir and
// waits until it accepts connections. It fails the test if the broker is
// already running, exits, or does not listen within 10 s.
func (m *Mosquitto) Start() {
	m.t.Helper()
	if pid := m.Pid(); pid != 0 {
		m.t.Fatalf("harness: Start: mosquitto on port %d is already running (pid %d)", m.port, pid)
	}
	m.mu.Lock()
	m.runs++
	marker := fmt.Sprintf("=== harness: mosquitto start #%d ===", m.runs)
	var runFrom int64
	if fi, err := os.Stat(m.logPath); err == nil {
		runFrom = fi.Size()
	}
	proc, err := startChild(m.exe, []string{"-c", m.conf}, os.Environ(), m.dir, m.logPath, marker)
	if err == nil {
		m.proc, m.runFrom = proc, runFrom
	}
	m.mu.Unlock()
	if err != nil {
		m.t.Fatalf("harness: %v", err)
	}
	// Ready means this run logged that it runs and the port answers. The
	// port alone could be another process's (then this broker exits with
	// "Address already in use").
	accepting := Poll(brokerStartTimeout, func() bool {
		if !proc.running() {
			return true // stop polling; reported below
		}
		if !strings.Contains(m.runLog(), " running") {
			return false
		}
		c, err := net.DialTimeout("tcp", m.Addr(), time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	if !proc.running() {
		m.t.Fatalf("harness: mosquitto on port %d exited with code %d during start; log:\n%s",
			m.port, proc.exitCode(), m.LogTail(30))
	}
	if !accepting {
		m.t.Fatalf("harness: mosquitto on port %d not accepting connections after %s; log:\n%s",
			m.port, brokerStartTimeout, m.LogTail(30))
	}
}

// Stop sends SIGTERM (mosquitto then saves its database) and waits; after
// 10 s it SIGKILLs and fails the test. A stopped broker is left alone.
func (m *Mosquitto) Stop() {
	m.t.Helper()
	proc, _ := m.current()
	if proc == nil {
		return
	}
	if err := proc.stop(brokerStopTimeout); err != nil {
		m.t.Fatalf("harness: stop mosquitto on port %d: %v; log:\n%s", m.port, err, m.LogTail(30))
	}
}

// Kill SIGKILLs the broker, as a crash or power loss would, and waits for
// it to be gone. Without DurableOnKill it loses what it had not saved.
func (m *Mosquitto) Kill() {
	m.t.Helper()
	proc, _ := m.current()
	if proc == nil {
		return
	}
	if err := proc.kill(); err != nil {
		m.t.Fatalf("harness: kill mosquitto on port %d: %v", m.port, err)
	}
}

// Restart is Stop then Start: a graceful broker restart.
func (m *Mosquitto) Restart() {
	m.t.Helper()
	m.Stop()
	m.Start()
}

// runLog is the current run's part of the log.
func (m *Mosquitto) runLog() string {
	_, from := m.current()
	return logFrom(m.logPath, from)
}

// LogTail returns the last n lines of the broker's log (all runs, with a
// marker line per start); n <= 0 returns all of it.
func (m *Mosquitto) LogTail(n int) string { return tail(m.logPath, n) }
