package mqttout

import (
	"fmt"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// maxQueuedAcks bounds the ACKs decoded but not yet matched by the sender.
const maxQueuedAcks = 1 << 16

// ackInbox hands event IDs from paho's network reader, which must never
// block, to the goroutine that matches them against records in flight.
type ackInbox struct {
	mu     sync.Mutex
	ids    []string
	signal chan struct{} // capacity 1: "there is something to drain"
}

func newAckInbox() *ackInbox { return &ackInbox{signal: make(chan struct{}, 1)} }

// push queues id; false when the inbox is full and id was dropped (the
// record then times out and is resent, which produces a fresh ACK).
func (a *ackInbox) push(id string) bool {
	a.mu.Lock()
	if len(a.ids) >= maxQueuedAcks {
		a.mu.Unlock()
		return false
	}
	a.ids = append(a.ids, id)
	a.mu.Unlock()
	select {
	case a.signal <- struct{}{}:
	default:
	}
	return true
}

// drain takes every queued ID.
func (a *ackInbox) drain() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := a.ids
	a.ids = nil
	return ids
}

// recentIDs remembers the last confirmed event IDs, to tell a duplicate ACK
// from one for an ID we never had in flight.
type recentIDs struct {
	ring []string
	next int
	set  map[string]struct{}
}

func newRecentIDs(n int) *recentIDs {
	return &recentIDs{ring: make([]string, n), set: make(map[string]struct{}, n)}
}

func (r *recentIDs) add(id string) {
	if old := r.ring[r.next]; old != "" {
		delete(r.set, old)
	}
	r.ring[r.next] = id
	r.set[id] = struct{}{}
	r.next = (r.next + 1) % len(r.ring)
}

func (r *recentIDs) has(id string) bool {
	_, ok := r.set[id]
	return ok
}

// ignoredLog writes the warning for an ignored ACK at most once per interval
// and reason: publishers that share an ACK topic see every other
// publisher's ACKs, which must not flood the log (the metric counts each).
type ignoredLog struct {
	every time.Duration
	last  map[string]time.Time
	quiet map[string]int // ignored since the last line, per reason
}

func newIgnoredLog(every time.Duration) *ignoredLog {
	return &ignoredLog{every: every, last: map[string]time.Time{}, quiet: map[string]int{}}
}

// warn logs the ignored ACK for id unless a line for reason was written
// within the interval. Not safe for concurrent use.
func (l *ignoredLog) warn(log *service.Logger, reason, id string) {
	now := time.Now()
	if t, ok := l.last[reason]; ok && now.Sub(t) < l.every {
		l.quiet[reason]++
		return
	}
	more := ""
	if n := l.quiet[reason]; n > 0 {
		more = fmt.Sprintf(" (and %d more %s ACKs since the last such line)", n, reason)
	}
	log.Warnf("Ignoring %s ACK for event %s: no published, unconfirmed record has this ID%s", reason, id, more)
	l.last[reason], l.quiet[reason] = now, 0
}
