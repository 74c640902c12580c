package ledgerclock

import (
	"sync"
	"time"
)

// For the ledgers' tests.

// Fake is a wall clock a test steps and a monotonic clock it advances.
type Fake struct {
	mu   sync.Mutex
	wall time.Time
	mono time.Duration
}

// NewFake returns a Fake whose wall clock reads wall.
func NewFake(wall time.Time) *Fake { return &Fake{wall: wall} }

// Source reads f.
func (f *Fake) Source() Source {
	return Source{
		Wall: func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.wall },
		Mono: func() time.Duration { f.mu.Lock(); defer f.mu.Unlock(); return f.mono },
	}
}

// Step sets the wall clock to to; the monotonic clock does not move.
func (f *Fake) Step(to time.Time) { f.mu.Lock(); f.wall = to; f.mu.Unlock() }

// Pass lets d pass: both clocks move.
func (f *Fake) Pass(d time.Duration) {
	f.mu.Lock()
	f.wall, f.mono = f.wall.Add(d), f.mono+d
	f.mu.Unlock()
}

// Down lets d pass while no process runs: a new process's monotonic clock
// starts elsewhere, and the wall clock moves.
func (f *Fake) Down(d time.Duration) { f.Pass(d) }

// Wall-clock readings the ledgers' tests step between.
var (
	Day2of1970 = time.Date(1970, 1, 2, 0, 0, 0, 0, time.UTC)
	Today      = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
)

// StepCase is a wall clock that starts at Start and is stepped to To,
// between two runs of a ledger or during one.
type StepCase struct {
	Name      string
	Start, To time.Time
	DuringRun bool
}

// StepCases are the steps every ledger is tested under: to today from
// 1970, back to 1970, years ahead.
var StepCases = []StepCase{
	{"1970 to today between runs", Day2of1970, Today, false},
	{"1970 to today during a run", Day2of1970, Today, true},
	{"today to 1970 between runs", Today, time.Unix(0, 0), false},
	{"today to 1970 during a run", Today, time.Unix(0, 0), true},
	{"today to 2100 between runs", Today, Today.AddDate(74, 0, 0), false},
}
