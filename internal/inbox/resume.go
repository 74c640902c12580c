package inbox

import (
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// resumeWindow is how long after a resumed connection the messages the
// broker sends are counted for the resume log line. The broker sends what
// it kept for the session right after CONNACK.
const resumeWindow = 5 * time.Second

// ResumeLog makes a resumed session visible: how many messages the broker
// sent in the first resumeWindow of it, and how many of those matched no
// topic and were held unacknowledged (startup replay). Connections are
// told apart by their generation, which grows with each new connection.
type ResumeLog struct {
	cfg Config
	log InfoLogger

	mu     sync.Mutex
	gen    uint64 // the connection being counted
	start  time.Time
	counts struct{ received, dup, held int }
}

// InfoLogger is what ResumeLog reports through.
type InfoLogger interface {
	Infof(format string, args ...any)
}

// NewResumeLog reports through log (Benthos's *service.Logger fits).
func NewResumeLog(cfg Config, log InfoLogger) *ResumeLog {
	return &ResumeLog{cfg: cfg, log: log}
}

// restart starts counting connection gen.
func (r *ResumeLog) restart(gen uint64) {
	r.gen, r.start = gen, time.Now()
	r.counts = struct{ received, dup, held int }{}
}

// OnMessage counts a message of connection gen, if it is the newest, during
// its first resumeWindow. It runs on the client's network reader before the
// inbox routes the message; messages may arrive before OnConnect runs.
func (r *ResumeLog) OnMessage(gen uint64, msg mqttmsg.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case gen < r.gen:
		return
	case gen > r.gen:
		r.restart(gen)
	case time.Since(r.start) > resumeWindow:
		return
	}
	r.counts.received++
	if msg.Duplicate() {
		r.counts.dup++
	}
	if _, ok := r.cfg.Subs.Match(msg.Topic()); !ok {
		r.counts.held++
	}
}

// OnConnect schedules the report for connection gen when the broker kept
// its session.
func (r *ResumeLog) OnConnect(gen uint64, sessionPresent bool) {
	if !sessionPresent || r.cfg.CleanSession {
		return
	}
	r.mu.Lock()
	if gen > r.gen {
		r.restart(gen)
	}
	r.mu.Unlock()
	time.AfterFunc(resumeWindow, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.gen != gen {
			return // a newer connection replaced it
		}
		r.log.Infof("Resumed the session of client %q: the broker sent %d messages in its first %s (%d marked as redeliveries); %d matched none of topics %v and were held unacknowledged",
			r.cfg.ClientID, r.counts.received, resumeWindow, r.counts.dup, r.counts.held, r.cfg.Topics)
	})
}
