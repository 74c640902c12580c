package ledger

import (
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// summaryInterval is how often, at most, the processor logs how many copies
// passed and how many were duplicates. Nothing is logged while both are 0.
const summaryInterval = 10 * time.Second

// summary counts passed copies and duplicates for a periodic info line. A
// timer is armed by the first count of an interval, so an idle processor
// logs nothing and holds no goroutine.
type summary struct {
	log   *service.Logger
	flag  bool          // on_duplicate: flag (duplicates are passed on, not dropped)
	every time.Duration // summaryInterval; tests shorten it

	mu           sync.Mutex
	passed, dups int64
	armed        bool
}

func (s *summary) add(passed, dups int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.passed += passed
	s.dups += dups
	if !s.armed {
		s.armed = true
		time.AfterFunc(s.every, s.flush)
	}
}

func (s *summary) flush() {
	s.mu.Lock()
	passed, dups := s.passed, s.dups
	s.passed, s.dups, s.armed = 0, 0, false
	s.mu.Unlock()
	verb := "dropped"
	if s.flag {
		verb = "flagged"
	}
	s.log.Infof("dedup_ledger: %d passed, %d duplicates %s in the last %s", passed, dups, verb, s.every)
}

// tally is a metric counter that also feeds the summary.
type tally struct {
	c   *service.MetricCounter
	add func(int64)
}

func (t tally) Incr(n int64) {
	t.c.Incr(n)
	t.add(n)
}
