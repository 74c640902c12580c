// Package harness starts the real parts that end-to-end, crash and chaos
// suites need: mosquitto brokers, the reliable-mqtt binary in child
// processes, a TCP proxy that cuts and stalls connections, and plain paho
// clients to publish and observe.
//
// Every constructor takes a testing.TB and registers its cleanup with
// t.Cleanup, so a test never leaks a process or a listener. Every wait is
// bounded. Everything listens on and connects to 127.0.0.1 only.
//
// Methods that fail the test (t.Fatal) must be called from the test's own
// goroutine, as the testing package requires.
package harness

import (
	"net"
	"testing"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// Another process may take it before the caller binds it; in practice the
// kernel does not hand out the same ephemeral port again so soon.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("harness: find a free port on 127.0.0.1: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// pollInterval is how often Poll, Eventually and the Wait* helpers look again.
const pollInterval = 20 * time.Millisecond

// Eventually polls cond about every 20ms until it returns true, and fails
// the test if it has not after timeout. what names the awaited condition
// in the failure message.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// Poll reports whether cond became true within timeout, looking about
// every 20ms. cond is always evaluated at least once, and once more at the
// deadline. Unlike Eventually it does not fail the test, so it may be
// called from any goroutine.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollInterval)
	}
}

// PollProgress is Poll for a wait whose length is the machine's speed
// times a fixed amount of work (a stream of messages to accept, deliver or
// drain): a slow machine must not fail it, a stuck one must. cond returns
// how far the work got (any number that grows as it goes on) and whether
// it is done. PollProgress gives up when that number has not changed for
// stall, or after limit in all, and reports whether cond was done.
func PollProgress(stall, limit time.Duration, cond func() (progress int, done bool)) bool {
	start := time.Now()
	last, lastChange := 0, start
	for first := true; ; first = false {
		n, done := cond()
		if done {
			return true
		}
		now := time.Now()
		if first || n != last {
			last, lastChange = n, now
		}
		if now.Sub(lastChange) > stall || now.Sub(start) > limit {
			return false
		}
		time.Sleep(pollInterval)
	}
}
