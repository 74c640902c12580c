// Package ledgerclock is the time the dedup ledgers keep keys by. A wall
// clock can be stepped by any amount, either way, at any moment (a gateway
// without a battery-backed clock boots at 1970, NTP moves it years later),
// so retention measured on it deletes keys early. A ledger clock instead
// starts from a reading its ledger stored and advances only by the
// monotonic time this process observes, which no step of the wall clock
// moves. The wall clock is read once: to start a ledger that has no reading
// yet.
package ledgerclock

import (
	"sync"
	"time"
)

// Source is where a ledger clock reads time; tests replace it.
type Source struct {
	// Wall is read only to start a ledger that stored no reading yet.
	Wall func() time.Time
	// Mono is the monotonic time since a fixed instant of this process.
	Mono func() time.Duration
}

// processStart anchors System's monotonic readings: time.Since on a
// time.Now reading uses the monotonic clock, never the wall clock.
var processStart = time.Now()

// System is the process's clocks.
func System() Source {
	return Source{Wall: time.Now, Mono: func() time.Duration { return time.Since(processStart) }}
}

// OrSystem returns s, or System for a zero Source.
func (s Source) OrSystem() Source {
	if s.Wall == nil || s.Mono == nil {
		return System()
	}
	return s
}

// Clock is one ledger's time in this process, in Unix nanoseconds: the
// reading it was last set to plus the monotonic time since. Safe for
// concurrent use.
type Clock struct {
	src Source

	mu   sync.Mutex
	base int64         // ledger time at mono
	mono time.Duration // src.Mono() when base was set
}

// New starts a clock at reading base.
func New(src Source, base int64) *Clock {
	src = src.OrSystem()
	return &Clock{src: src, base: base, mono: src.Mono()}
}

// Now returns the ledger time.
func (c *Clock) Now() int64 { return c.NowWithin(0) }

// NowWithin is Now counting at most maxStep (if positive) of monotonic
// time since the last Set. A clock shared by several processes
// (sqlledger) is set from the shared reading every few seconds; one that
// could not reach it for longer counts less time, never more, so that no
// single advance of the shared reading jumps by more than maxStep.
func (c *Clock) NowWithin(maxStep time.Duration) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.src.Mono() - c.mono
	if d < 0 {
		d = 0 // a monotonic clock does not go back; a test's might
	}
	if maxStep > 0 && d > maxStep {
		d = maxStep
	}
	return c.base + int64(d)
}

// Set makes v the reading now: the shared reading a process just stored
// its own into (the later of the two).
func (c *Clock) Set(v int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.base, c.mono = v, c.src.Mono()
}

// Start is the first reading of a ledger that stored none: the wall clock,
// or the newest stamp already stored if that is later, so that the clock
// starts after every key.
func Start(src Source, newest int64) int64 {
	return max(src.OrSystem().Wall().UnixNano(), newest)
}
