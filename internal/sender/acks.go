package sender

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// maxQueuedAcks bounds the ACKs decoded but not yet matched by the sender.
const maxQueuedAcks = 1 << 16

// AckQueue hands event IDs from the network reader, which must never
// block, to the goroutine that matches them against records in flight.
type AckQueue struct {
	mu     sync.Mutex
	ids    []string
	signal chan struct{} // capacity 1: "there is something to drain"
}

// NewAckQueue returns an empty queue.
func NewAckQueue() *AckQueue { return &AckQueue{signal: make(chan struct{}, 1)} }

// Push queues id; false when the queue is full and id was dropped (the
// record then times out and is resent, which produces a fresh ACK).
func (a *AckQueue) Push(id string) bool {
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

// Receive takes an ACK's payload as it arrived on topic. It runs on the
// network reader and never blocks: an ACK that is malformed, not signed
// with one of keys (when keys is not nil) or beyond the queue's bound is
// ignored through ignored; any other is queued for matching.
func (a *AckQueue) Receive(topic string, payload []byte, keys [][]byte, ignored *IgnoredACKs) {
	id, err := codec.ReadAck(payload, keys)
	switch {
	case errors.Is(err, codec.ErrUnauthenticatedAck):
		ignored.Ignore(ReasonUnauthenticated, "for event "+id+": "+err.Error())
		return
	case err != nil:
		ignored.Ignore(ReasonMalformed, fmt.Sprintf("on %q: %v", topic, err))
		return
	}
	if !a.Push(id) {
		ignored.Ignore(ReasonOverflow, "for event "+id+": too many ACKs waiting to be processed")
	}
}

// drain takes every queued ID.
func (a *AckQueue) drain() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := a.ids
	a.ids = nil
	return ids
}

// Reasons an ACK is ignored, the label of the acks_ignored counter.
const (
	ReasonMalformed = "malformed" // not a valid reliomq v1 ACK
	reasonUnknown   = "unknown"   // no published, unconfirmed record has this ID
	reasonDuplicate = "duplicate" // the record was confirmed already
	ReasonOverflow  = "overflow"  // too many ACKs queued for the sender

	ReasonUnauthenticated = "unauthenticated" // ack_auth_key set, auth missing or wrong
)

// IgnoredACKs accounts for ACKs that confirm nothing. Every one is counted;
// a warning is logged at most once per reason and interval, because
// publishers that share an ACK topic see each other's ACKs and must not
// flood the log. It also remembers recent confirmations, to tell a
// duplicate ACK from an unknown one. Safe for concurrent use: the paho
// reader reports malformed ACKs while the sender reports unmatched ones.
type IgnoredACKs struct {
	m     Metrics
	log   Logger
	every time.Duration

	mu     sync.Mutex
	recent *recentIDs
	last   map[string]time.Time
	quiet  map[string]int // ignored since the last line, per reason
}

// NewIgnoredACKs returns an account that counts through m and warns on log.
func NewIgnoredACKs(m Metrics, log Logger) *IgnoredACKs {
	return &IgnoredACKs{
		m: m, log: log, every: 10 * time.Second,
		recent: newRecentIDs(4096), last: map[string]time.Time{}, quiet: map[string]int{},
	}
}

// confirmed records that the record with event ID id was confirmed.
func (a *IgnoredACKs) confirmed(id string) {
	a.mu.Lock()
	a.recent.add(id)
	a.mu.Unlock()
}

// unmatched ignores an ACK for id that matches no record in flight.
func (a *IgnoredACKs) unmatched(id string) {
	a.mu.Lock()
	reason := reasonUnknown
	if a.recent.has(id) {
		reason = reasonDuplicate
	}
	a.mu.Unlock()
	a.Ignore(reason, "for event "+id+": no published, unconfirmed record has this ID")
}

// Ignore counts an ignored ACK and logs it unless a line for reason was
// written within the interval.
func (a *IgnoredACKs) Ignore(reason, what string) {
	a.m.OnIgnoredACK(reason)
	a.mu.Lock()
	now := time.Now()
	if t, ok := a.last[reason]; ok && now.Sub(t) < a.every {
		a.quiet[reason]++
		a.mu.Unlock()
		return
	}
	more := ""
	if n := a.quiet[reason]; n > 0 {
		more = fmt.Sprintf(" (and %d more %s ACKs since the last such line)", n, reason)
	}
	a.last[reason], a.quiet[reason] = now, 0
	a.mu.Unlock()
	a.log.Warnf("Ignoring %s ACK %s%s", reason, what, more)
}

// recentIDs remembers the last confirmed event IDs. Not safe for concurrent
// use on its own.
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

// AckHandlers are the connection handlers of an output confirmed end to
// end: at every connect, before the connection counts as ready, they
// subscribe to topic (QoS 1, so ACKs sent while we were away wait in the
// session); every message that arrives is an ACK, checked against keys
// (nil: not authenticated) and queued on acks or ignored through ignored.
// A retained message is warned about (at most when allowWarning says so):
// it comes back at every subscription, an ACK that never ends.
func AckHandlers(topic string, keys [][]byte, acks *AckQueue, ignored *IgnoredACKs, log Logger, allowWarning func() bool) mqttclient.Handlers {
	return mqttclient.Handlers{
		OnConnect: func(ctx context.Context, conn mqttclient.Conn) error {
			return conn.Subscribe(ctx, map[string]byte{topic: 1})
		},
		OnMessage: func(_ mqttclient.Conn, msg mqttmsg.Message) {
			if msg.Retained() && allowWarning() {
				log.Warnf("A retained message arrived on the ACK topic %q: the broker sends it again at every (re)subscription. ACKs must be published without the retain flag; clear it with an empty retained message (mosquitto_pub -r -n -t '%s')", msg.Topic(), msg.Topic())
			}
			acks.Receive(msg.Topic(), msg.Payload(), keys, ignored)
		},
	}
}
