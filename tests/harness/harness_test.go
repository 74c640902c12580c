package harness

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary act as a small child program (see
// runHelper) so Proc can be tested without the real reliable-mqtt.
const helperEnv = "HARNESS_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// helperLifetime bounds a helper child the test forgot to end.
const helperLifetime = 60 * time.Second

// runHelper is the child program. Modes:
//   - serve: print the config named by -c and "ready", exit 0 on SIGTERM;
//   - ignore-term: print "ready", ignore SIGTERM;
//   - exit7: print "bye" and exit with code 7.
func runHelper(mode string, args []string) int {
	switch mode {
	case "serve":
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		if len(args) >= 2 && args[0] == "-c" {
			b, err := os.ReadFile(args[1])
			if err != nil {
				fmt.Println("read config:", err)
				return 2
			}
			fmt.Printf("config: %s\n", b)
		}
		fmt.Printf("ready pid=%d\n", os.Getpid())
		select {
		case <-term:
			fmt.Println("got SIGTERM, exiting")
			return 0
		case <-time.After(helperLifetime):
			return 3
		}
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		time.Sleep(helperLifetime)
		return 3
	case "exit7":
		fmt.Println("bye")
		return 7
	}
	fmt.Println("unknown helper mode", mode)
	return 2
}

func helperOptions(t *testing.T, mode string) ProcOptions {
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("find test binary: %v", err)
	}
	return ProcOptions{Binary: exe, Env: []string{helperEnv + "=" + mode}}
}

func numbered(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "%s-%03d", prefix, i)
	}
	return out
}

func payloadsOf(msgs []Received) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Payload)
	}
	return out
}

// queueWhileOffline registers a persistent session, takes it offline and
// publishes n messages that the broker must queue for it.
func queueWhileOffline(t *testing.T, m *Mosquitto, clientID, topic string, n int) [][]byte {
	t.Helper()
	s := Subscribe(t, m.URL(), clientID, false, topic)
	s.Close()
	msgs := numbered("queued", n)
	Publish(t, m.URL(), topic, msgs)
	return msgs
}

// receiveQueued resumes the session and returns what arrives before a
// marker published afterwards: exactly the messages the broker had queued.
func receiveQueued(t *testing.T, m *Mosquitto, clientID, topic string) []string {
	t.Helper()
	s := Subscribe(t, m.URL(), clientID, false, topic)
	Publish(t, m.URL(), topic, Payloads("marker"))
	Eventually(t, 10*time.Second, "the marker message", func() bool {
		msgs := s.Messages()
		return len(msgs) > 0 && string(msgs[len(msgs)-1].Payload) == "marker"
	})
	got := payloadsOf(s.Messages())
	s.Close()
	return got[:len(got)-1]
}

func wantPayloads(t *testing.T, got []string, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d queued messages %q, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != string(want[i]) {
			t.Fatalf("message %d = %q, want %q (all: %q)", i, got[i], want[i], got)
		}
	}
}

func TestMosquittoGracefulRestartKeepsOfflineSessionQueue(t *testing.T) {
	m := StartMosquitto(t, MosquittoOptions{Persistence: true})
	want := queueWhileOffline(t, m, "harness-graceful", "harness/graceful", 20)
	oldPid := m.Pid()
	m.Restart()
	if m.Pid() == oldPid {
		t.Fatalf("Restart kept pid %d; want a new process", oldPid)
	}
	wantPayloads(t, receiveQueued(t, m, "harness-graceful", "harness/graceful"), want)
}

// The control for the test above: the same steps without persistence lose
// the queue, so receiveQueued can tell the difference.
func TestMosquittoRestartWithoutPersistenceLosesOfflineSessionQueue(t *testing.T) {
	m := StartMosquitto(t, MosquittoOptions{})
	queueWhileOffline(t, m, "harness-volatile", "harness/volatile", 5)
	m.Restart()
	wantPayloads(t, receiveQueued(t, m, "harness-volatile", "harness/volatile"), nil)
}

func TestMosquittoKillWithDurableOnKillKeepsOfflineSessionQueue(t *testing.T) {
	m := StartMosquitto(t, MosquittoOptions{DurableOnKill: true})
	want := queueWhileOffline(t, m, "harness-killed", "harness/killed", 20)
	// The PUBACK can reach us just before the autosave that follows it; the
	// last payload in mosquitto.db shows the save happened.
	db := filepath.Join(m.PersistenceDir(), "mosquitto.db")
	Eventually(t, 5*time.Second, "the last message in "+db, func() bool {
		b, err := os.ReadFile(db)
		return err == nil && bytes.Contains(b, want[len(want)-1])
	})
	m.Kill()
	if m.Running() {
		t.Fatal("broker still running after Kill")
	}
	m.Start()
	wantPayloads(t, receiveQueued(t, m, "harness-killed", "harness/killed"), want)
	if !strings.Contains(m.LogTail(0), "=== harness: mosquitto start #2 ===") {
		t.Fatalf("log has no marker for the second start:\n%s", m.LogTail(20))
	}
}

// The control for the test above: persistence alone saves only every 30
// minutes, so a SIGKILL loses the queue.
func TestMosquittoKillWithoutDurableOnKillLosesOfflineSessionQueue(t *testing.T) {
	m := StartMosquitto(t, MosquittoOptions{Persistence: true})
	queueWhileOffline(t, m, "harness-lost", "harness/lost", 5)
	m.Kill()
	m.Start()
	wantPayloads(t, receiveQueued(t, m, "harness-lost", "harness/lost"), nil)
}

func TestMosquittoStartFailureShowsLog(t *testing.T) {
	// A second broker on a taken port must fail loudly, with mosquitto's own
	// words. Run it against a recorder so the failure can be inspected.
	first := StartMosquitto(t, MosquittoOptions{})
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		StartMosquitto(rec, MosquittoOptions{Port: first.Port()})
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("StartMosquitto on a taken port did not return")
	}
	if !strings.Contains(rec.msg, "exited") || !strings.Contains(rec.msg, "Address already in use") {
		t.Fatalf("failure message should say the broker exited and why, got:\n%s", rec.msg)
	}
}

// fatalRecorder turns Fatal into a goroutine exit and keeps the message;
// everything else goes to the real test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *fatalRecorder) Fatal(args ...any) {
	r.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

func TestProxyCutDropsClientAndRestoreLetsItReconnect(t *testing.T) {
	m := StartMosquitto(t, MosquittoOptions{})
	p := NewProxy(t, m.Addr())
	s := Subscribe(t, p.URL(), "harness-cut", true, "harness/cut")
	if p.Conns() != 1 {
		t.Fatalf("proxy has %d connections, want 1", p.Conns())
	}

	p.Cut()
	Eventually(t, 5*time.Second, "the subscriber to notice the cut", func() bool { return !s.Connected() })
	Eventually(t, 5*time.Second, "the proxy to have no connections", func() bool { return p.Conns() == 0 })
	// While cut, reconnect attempts (≤1 s apart) are refused.
	time.Sleep(1500 * time.Millisecond)
	if s.Connects() != 1 {
		t.Fatalf("subscriber connected %d times during the cut, want only the first", s.Connects())
	}

	p.Restore()
	Eventually(t, 10*time.Second, "the subscriber to reconnect", func() bool { return s.Connects() == 2 && s.Connected() })
	// Clean session: the re-subscribe on reconnect makes new messages flow.
	Eventually(t, 5*time.Second, "a message after reconnect", func() bool {
		Publish(t, m.URL(), "harness/cut", Payloads("after"))
		return s.WaitCount(1, 200*time.Millisecond)
	})
	if err := s.SubscribeErr(); err != nil {
		t.Fatalf("re-subscribe failed: %v", err)
	}
}

func TestProxyStallHoldsBytesUntilRestore(t *testing.T) {
	// A plain TCP target shows byte-level behaviour exactly.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	p := NewProxy(t, ln.Addr().String())
	client, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	var server net.Conn
	select {
	case server = <-accepted:
		t.Cleanup(func() { server.Close() })
	case <-time.After(5 * time.Second):
		t.Fatal("proxy did not connect to the target")
	}
	Eventually(t, 5*time.Second, "one proxied connection", func() bool { return p.Conns() == 1 })

	p.Stall()
	if _, err := client.Write([]byte("up")); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Write([]byte("down")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	for _, c := range []net.Conn{server, client} {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if n, err := c.Read(buf); n > 0 || !isTimeout(err) {
			t.Fatalf("read during stall returned %q, %v; want a timeout", buf[:n], err)
		}
	}
	if p.Conns() != 1 {
		t.Fatalf("stall closed the connection: %d open, want 1", p.Conns())
	}

	p.Restore()
	for c, want := range map[net.Conn]string{server: "up", client: "down"} {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, len(want))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
			t.Fatalf("after Restore read %q, %v; want %q", got, err, want)
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestProxyStallDelaysMQTTMessagesUntilRestore(t *testing.T) {
	m := StartMosquitto(t, MosquittoOptions{})
	p := NewProxy(t, m.Addr())
	s := Subscribe(t, p.URL(), "harness-stall", true, "harness/stall")
	p.Stall()
	Publish(t, m.URL(), "harness/stall", numbered("stalled", 3))
	if s.WaitCount(1, 300*time.Millisecond) {
		t.Fatalf("subscriber received %q through a stalled proxy", payloadsOf(s.Messages()))
	}
	p.Restore()
	if !s.WaitCount(3, 5*time.Second) {
		t.Fatalf("after Restore got %q, want 3 messages", payloadsOf(s.Messages()))
	}
	if s.Connects() != 1 {
		t.Fatalf("subscriber reconnected (%d connects); a short stall should not drop it", s.Connects())
	}
}

func TestRunPipelineKillRestartStop(t *testing.T) {
	p := RunPipeline(t, "input: {generate: {}}\n", helperOptions(t, "serve"))
	if !p.WaitForLog("ready", 10*time.Second) {
		t.Fatalf("helper never became ready:\n%s", p.Log())
	}
	if !strings.Contains(p.Log(), "config: input: {generate: {}}") {
		t.Fatalf("helper did not get the config via -c:\n%s", p.Log())
	}
	firstPid := p.Pid()
	if !strings.Contains(p.Log(), fmt.Sprintf("ready pid=%d", firstPid)) {
		t.Fatalf("Pid() = %d does not match the log:\n%s", firstPid, p.Log())
	}

	p.Kill()
	if p.Running() {
		t.Fatal("still running after Kill")
	}
	if code, err := p.Wait(time.Second); err != nil || code != -1 {
		t.Fatalf("after SIGKILL Wait = %d, %v; want -1 (killed by signal)", code, err)
	}

	p.Restart()
	if p.Pid() == firstPid {
		t.Fatalf("Restart kept pid %d", firstPid)
	}
	if !p.WaitForLog(fmt.Sprintf("ready pid=%d", p.Pid()), 10*time.Second) {
		t.Fatalf("restarted helper never became ready:\n%s", p.Log())
	}
	// WaitForLog only looks at the current run.
	if p.WaitForLog(fmt.Sprintf("ready pid=%d", firstPid), 0) {
		t.Fatal("WaitForLog matched output of the previous run")
	}
	if got := strings.Count(p.Log(), "=== harness: start #"); got != 2 {
		t.Fatalf("log has %d start markers, want 2:\n%s", got, p.Log())
	}

	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("Stop: %v\n%s", err, p.Log())
	}
	if code, err := p.Wait(time.Second); err != nil || code != 0 {
		t.Fatalf("after SIGTERM Wait = %d, %v; want 0", code, err)
	}
	if !strings.Contains(p.RunLog(), "got SIGTERM") {
		t.Fatalf("helper did not see SIGTERM:\n%s", p.Log())
	}
}

func TestProcStopKillsWhatIgnoresSIGTERM(t *testing.T) {
	p := RunPipeline(t, "", helperOptions(t, "ignore-term"))
	if !p.WaitForLog("ready", 10*time.Second) {
		t.Fatalf("helper never became ready:\n%s", p.Log())
	}
	err := p.Stop(300 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "SIGKILL") {
		t.Fatalf("Stop = %v; want an error saying it had to SIGKILL", err)
	}
	if p.Running() {
		t.Fatal("still running after Stop escalated to SIGKILL")
	}
}

func TestProcWaitReportsExitCode(t *testing.T) {
	p := RunPipeline(t, "", helperOptions(t, "exit7"))
	code, err := p.Wait(10 * time.Second)
	if err != nil || code != 7 {
		t.Fatalf("Wait = %d, %v; want 7", code, err)
	}
	if !strings.Contains(p.Log(), "bye") {
		t.Fatalf("log lacks the helper's output:\n%s", p.Log())
	}
}

func TestProcWaitTimesOutWhileRunning(t *testing.T) {
	p := RunPipeline(t, "", helperOptions(t, "serve"))
	if _, err := p.Wait(100 * time.Millisecond); err == nil {
		t.Fatal("Wait on a running process returned no error")
	}
	if !p.Running() {
		t.Fatal("Wait's timeout must not end the process")
	}
}

// The real binary: build it and run a pipeline that ends by itself.
func TestRealBinaryRunsGeneratePipeline(t *testing.T) {
	p := RunPipeline(t, `
input:
  generate:
    mapping: root = "hello"
    count: 3
    interval: 1ms
output:
  stdout: {}
`, ProcOptions{})
	code, err := p.Wait(60 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("reliable-mqtt exited %d, %v; log:\n%s", code, err, p.Log())
	}
	lines := 0
	sc := bufio.NewScanner(strings.NewReader(p.RunLog()))
	for sc.Scan() {
		if sc.Text() == "hello" {
			lines++
		}
	}
	if lines != 3 {
		t.Fatalf("got %d lines of hello, want 3; log:\n%s", lines, p.Log())
	}
}

func TestFreePortCanBeListenedOn(t *testing.T) {
	port := FreePort(t)
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("listen on FreePort %d: %v", port, err)
	}
	ln.Close()
}

// PollProgress waits as long as the work moves, and gives up once it
// stands still for the stall time.
func TestPollProgressWaitsWhileProgressingAndGivesUpWhenStuck(t *testing.T) {
	calls := 0
	if !PollProgress(time.Minute, time.Minute, func() (int, bool) { calls++; return calls, calls == 30 }) {
		t.Fatal("PollProgress gave up on a condition that progressed on every call")
	}
	start := time.Now()
	if PollProgress(200*time.Millisecond, time.Minute, func() (int, bool) { return 7, false }) {
		t.Fatal("PollProgress reported done for a condition that never was")
	}
	if took := time.Since(start); took < 200*time.Millisecond || took > 30*time.Second {
		t.Fatalf("a stuck condition was given up after %s, want about the stall time of 200ms", took)
	}
	calls = 0
	start = time.Now()
	if PollProgress(time.Minute, 200*time.Millisecond, func() (int, bool) { calls++; return calls, false }) {
		t.Fatal("PollProgress reported done for a condition that never was")
	}
	if took := time.Since(start); took < 200*time.Millisecond || took > 30*time.Second {
		t.Fatalf("a progressing but endless condition was given up after %s, want about the limit of 200ms", took)
	}
}
