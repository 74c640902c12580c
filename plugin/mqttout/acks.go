package mqttout

import "sync"

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
