package mqttin

import (
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
)

// resumeWindow is how long after a resumed connection the messages the
// broker sends are counted for the resume log line. The broker sends what
// it kept for the session right after CONNACK.
const resumeWindow = 5 * time.Second

// resumeLog makes a resumed session visible: how many messages the broker
// sent in the first resumeWindow of it, and how many of those matched no
// topic and were held unacknowledged (startup replay).
type resumeLog struct {
	s   *settings
	log *service.Logger

	mu     sync.Mutex
	gen    uint64 // the connection being counted (Conn.Gen())
	start  time.Time
	counts struct{ received, dup, held int }
}

// onMessage counts a message of the newest connection during its first
// resumeWindow. It runs on paho's network reader before the inbox routes
// the message; messages may arrive before onConnect runs.
func (r *resumeLog) onMessage(conn mqttclient.Conn, msg mqttclient.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case conn.Gen() < r.gen:
		return
	case conn.Gen() > r.gen:
		r.gen, r.start = conn.Gen(), time.Now()
		r.counts = struct{ received, dup, held int }{}
	case time.Since(r.start) > resumeWindow:
		return
	}
	r.counts.received++
	if msg.Duplicate() {
		r.counts.dup++
	}
	if _, ok := r.s.subs.Match(msg.Topic()); !ok {
		r.counts.held++
	}
}

// onConnect schedules the report for a connection whose session the broker
// kept.
func (r *resumeLog) onConnect(conn mqttclient.Conn) {
	if !conn.SessionPresent() || r.s.client.CleanSession {
		return
	}
	r.mu.Lock()
	if conn.Gen() > r.gen {
		r.gen, r.start = conn.Gen(), time.Now()
		r.counts = struct{ received, dup, held int }{}
	}
	r.mu.Unlock()
	time.AfterFunc(resumeWindow, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.gen != conn.Gen() {
			return // a newer connection replaced it
		}
		r.log.Infof("Resumed the session of client %q: the broker sent %d messages in its first %s (%d marked as redeliveries); %d matched none of topics %v and were held unacknowledged",
			r.s.client.ClientID, r.counts.received, resumeWindow, r.counts.dup, r.counts.held, r.s.topics)
	})
}
