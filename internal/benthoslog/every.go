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
	last     atomic.Int64 // unix ns of the last Allow that returned true
}

// Allow reports whether a warning may be logged now.
func (e *Every) Allow() bool {
	now := time.Now().UnixNano()
	last := e.last.Load()
	if last != 0 && now-last < int64(e.Interval) {
		return false
	}
	return e.last.CompareAndSwap(last, now)
}
