package dedup

import (
	"sync"
	"time"
)

// SummaryInterval is how often, at most, dedup_ledger logs how many copies
// passed and how many were duplicates (docs/operations.md). Nothing is
// logged while both are 0.
const SummaryInterval = 10 * time.Second

// Summary counts passed copies and duplicates for a periodic info line. A
// timer is armed by the first count of an interval, so an idle processor
// logs nothing and holds no goroutine.
type Summary struct {
	Logf  func(format string, args ...any)
	Every time.Duration // SummaryInterval; tests shorten it

	mu           sync.Mutex
	passed, dups int64
	armed        bool
}

// Add counts passed copies and duplicates.
func (s *Summary) Add(passed, dups int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.passed += passed
	s.dups += dups
	if !s.armed {
		s.armed = true
		time.AfterFunc(s.Every, s.flush)
	}
}

func (s *Summary) flush() {
	s.mu.Lock()
	passed, dups := s.passed, s.dups
	s.passed, s.dups, s.armed = 0, 0, false
	s.mu.Unlock()
	// "skipped" whatever on_duplicate says: a duplicate's effect is not
	// applied again, whether the copy is then dropped or passed on flagged
	// (and perhaps dropped later in the pipeline, as the quickstart does).
	s.Logf("dedup_ledger: %d passed, %d duplicates skipped in the last %s", passed, dups, s.Every)
}

// Counting returns c, also counted into the summary by add.
func Counting(c Counter, add func(int64)) Counter { return tally{c, add} }

type tally struct {
	c   Counter
	add func(int64)
}

func (t tally) Incr(n int64, labelValues ...string) {
	t.c.Incr(n, labelValues...)
	t.add(n)
}
