package periodic

import (
	"sync/atomic"
	"testing"
	"time"
)

// Run calls fn once per tick, and returns once stop is closed.
func TestRunCallsEveryTickUntilStopped(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	var calls atomic.Int64
	go func() {
		defer close(done)
		Run(stop, time.Millisecond, func() {
			if calls.Add(1) == 3 {
				close(stop)
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30 s of 3 ticks and a stop")
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d calls, want 3 (none after stop)", n)
	}
}
