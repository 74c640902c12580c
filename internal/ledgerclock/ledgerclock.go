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
	// maxStep, if positive, caps the monotonic time counted since the last
	// Set (see New).
	maxStep time.Duration

	mu   sync.Mutex
	base int64         // ledger time at mono
	mono time.Duration // src.Mono() when base was set
}

// New starts a clock at reading base. With maxStep > 0, no more than
// maxStep of monotonic time is counted beyond the last Set: a clock shared
// by several processes (sqlledger) is set from the shared reading at
// least that often, and a process that could not reach it for longer
// counts less time, never more.
func New(src Source, base int64, maxStep time.Duration) *Clock {
	src = src.OrSystem()
	return &Clock{src: src, maxStep: maxStep, base: base, mono: src.Mono()}
}

// Now returns the ledger time.
func (c *Clock) Now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.src.Mono() - c.mono
	if d < 0 {
		d = 0 // a monotonic clock does not go back; a test's might
	}
	if c.maxStep > 0 && d > c.maxStep {
		d = c.maxStep
	}
	return c.base + int64(d)
}

// Set makes v the reading now, if it is later than Now: a clock never
// goes back.
func (c *Clock) Set(v int64) {
	now := c.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.base, c.mono = max(v, now), c.src.Mono()
}

// Start is the first reading of a ledger that stored none: the wall clock,
// or the newest stamp already stored if that is later, so that the clock
// starts after every key.
func Start(src Source, newest int64) int64 {
	return max(src.OrSystem().Wall().UnixNano(), newest)
}
