package sender

import (
	"sync/atomic"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
)

// Confirmation is what confirms a record, chosen once from the output's
// `confirm` (ByPuback or ByAck); the sender, direct mode and the client's
// handlers ask it rather than each branching on the setting.
type Confirmation interface {
	// handlers are the client's connection handlers for it.
	handlers(acks *AckQueue, ignored *IgnoredACKs, log Logger) mqttclient.Handlers
	// pubackConfirms reports whether a PUBACK confirms a record; when it
	// does not, a failed PUBACK still ends the session.
	pubackConfirms() bool
	// wait is how long a published record waits for its confirmation.
	wait(c Config) time.Duration
	// what names the confirmation in errors.
	what() string
	// limit is how many records may be unconfirmed at once: the sizer's
	// limit and, where every unconfirmed record awaits its PUBACK, the
	// server's Receive Maximum.
	limit(sizerLimit, pubackMax int) int
}

// ByPuback confirms a record at the broker's PUBACK (confirm: broker).
func ByPuback() Confirmation { return byPuback{} }

type byPuback struct{}

func (byPuback) handlers(*AckQueue, *IgnoredACKs, Logger) mqttclient.Handlers {
	return mqttclient.Handlers{}
}
func (byPuback) pubackConfirms() bool        { return true }
func (byPuback) wait(c Config) time.Duration { return c.PublishTimeout }
func (byPuback) what() string                { return "PUBACK" }
func (byPuback) limit(s, p int) int          { return min(s, p) }

// ByAck confirms a record when an end-to-end ACK with its event ID arrives
// on topic within timeout (confirm: end_to_end); with keys (nil: none) the
// ACK must be signed with one of them.
func ByAck(topic string, timeout time.Duration, keys [][]byte) Confirmation {
	return byAck{topic: topic, timeout: timeout, keys: keys}
}

type byAck struct {
	topic   string
	timeout time.Duration
	keys    [][]byte
}

func (a byAck) handlers(acks *AckQueue, ignored *IgnoredACKs, log Logger) mqttclient.Handlers {
	return AckHandlers(a.topic, a.keys, acks, ignored, log, every(10*time.Second))
}
func (byAck) pubackConfirms() bool        { return false }
func (a byAck) wait(Config) time.Duration { return a.timeout }
func (a byAck) what() string              { return "ACK on " + a.topic }
func (byAck) limit(sizerLimit, _ int) int { return sizerLimit }

// every allows one warning per interval: a retained ACK comes back at
// every subscription.
func every(interval time.Duration) func() bool {
	var last atomic.Int64 // unix ns of the last allowed warning
	return func() bool {
		now, prev := time.Now().UnixNano(), last.Load()
		return (prev == 0 || now-prev >= int64(interval)) && last.CompareAndSwap(prev, now)
	}
}
