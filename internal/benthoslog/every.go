package benthoslog

import (
	"sync/atomic"
	"time"
)

// Every lets a warning through at most once per interval, for conditions
// that repeat with every message or connection (a retained message comes
// back at every subscription). The zero value with Interval set is ready;
// it is safe for concurrent use.
type Every struct {
	Interval time.Duration
	last     atomic.Int64 // monoNow of the last Allow that returned true
}

// epoch anchors monoNow: a wall-clock reading stepped back by a year would
// silence the warning for that year.
var epoch = time.Now()

// monoNow is the monotonic time since epoch, in ns; never 0.
func monoNow() int64 { return int64(time.Since(epoch)) + 1 }

// Allow reports whether a warning may be logged now.
func (e *Every) Allow() bool {
	now := monoNow()
	last := e.last.Load()
	if last != 0 && now-last < int64(e.Interval) {
		return false
	}
	return e.last.CompareAndSwap(last, now)
}
