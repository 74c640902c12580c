// Package inbox is the engine of reliable_mqtt_in between the MQTT
// client's network reader and the pipeline: it routes each received PUBLISH
// to a configured filter, suppresses retransmissions of packets still in
// flight (and of QoS 2 packets PUBREC'd and awaiting their PUBREL), holds
// unmatched messages of a resumed session during startup replay, queues and
// retries deliveries, decodes their envelopes (internal/codec), settles
// each attempt in the promised order (delivery hooks, then the end-to-end
// ACK, then the PUBACK: settle.go) and sends PUBACK/PUBREC strictly in
// receive order; its ResumeLog reports what a resumed session brought. It
// knows neither Benthos nor paho: the plugin hands it connections and
// messages through the small Conn interface and mqttmsg.Message.
package inbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// Conn is one network connection of the client. Distinct connections are
// distinct values (a pointer), so a Conn can key a map. mqttclient.Conn
// satisfies it.
type Conn interface {
	// Alive reports whether the connection has not been lost.
	Alive() bool
	// Lost is closed when the connection is gone.
	Lost() <-chan struct{}
	// Drop closes the connection on purpose without blocking.
	Drop(reason error)
	// Publish sends one message and waits, bounded by ctx, for its
	// completion (the PUBACK of an end-to-end ACK).
	Publish(ctx context.Context, p mqttmsg.Publication) error
}

// Logger is what the inbox logs through (Benthos's *service.Logger fits).
type Logger interface {
	Debugf(format string, args ...any)
	Warnf(format string, args ...any)
	Errorf(format string, args ...any)
}

// Counter and Gauge are metrics (Benthos's *service.MetricCounter and
// *service.MetricGauge fit).
type (
	Counter interface {
		Incr(n int64, labelValues ...string)
	}
	Gauge interface {
		Set(v int64, labelValues ...string)
	}
)

// Metrics the inbox keeps. Counters count messages.
type Metrics struct {
	Received        Counter // PUBLISHes received (retransmissions suppressed excluded)
	Acked           Counter // PUBACK/PUBREC sent
	Retried         Counter // rejected deliveries scheduled for another attempt
	Duplicates      Counter // retransmissions of a packet still being processed, not delivered again
	Unmatched       Counter // matched no topic after replay: acknowledged and dropped
	HeldTotal       Counter // unmatched messages held during startup replay
	DroppedUnacked  Counter // held messages dropped locally without ack at the replay timeout
	ReplayOverflows Counter // connections closed fail-closed by ReplayBufferSize
	QoS0Dropped     Counter // QoS 0 messages dropped beyond ReceiveBufferSize
	Held            Gauge   // messages held now
	Buffered        Gauge   // messages waiting for Next, up to ReceiveBufferSize
	Backlog         Gauge   // unacknowledged messages beyond ReceiveBufferSize
	Rejected        Counter // attempts the pipeline (or a hook, or the ACK publish) failed
	Malformed       Counter // envelopes that failed to decode (dropped or flagged)
	AcksPublished   Counter // end-to-end ACKs published to Ack.Topic
	AckPublishFails Counter // end-to-end ACKs that could not be published
}

// Config is what the inbox needs of the input's configuration.
type Config struct {
	ClientID          string // for error messages
	CleanSession      bool   // no startup replay: unmatched messages are routed ordinarily at once
	Topics            []string
	Subs              Subscriptions
	ReceiveBufferSize int           // at least 1
	ReplayTimeout     time.Duration // positive
	ReplayBufferSize  int           // 0 = unbounded
	// Retry is the delay before a rejected delivery is read again: it
	// grows with the delivery's failed attempts.
	Retry backoff.Backoff
	// Envelope is how Read decodes a payload: a codec mode (codec.None,
	// also ""; Ingress, Delivery, Properties).
	Envelope string
	// TraceContext accepts a W3C trace context in the reliomq v1 envelopes
	// (codec.Decoding.TraceContext).
	TraceContext bool
	// FlagMalformed delivers a malformed envelope with Decoded.Err set;
	// otherwise Read acknowledges and drops it.
	FlagMalformed bool
	Ack           EndToEnd // end-to-end ACKs; zero: none
}

// Inbox sits between the client's network reader and the pipeline's Read.
// OnMessage must never block, so everything it does is a few slice
// operations under mu.
//
// Memory is bounded: QoS 0 messages are capped at receiveBufferSize (the
// oldest is dropped beyond it); QoS 1/2 messages are never acknowledged
// before the pipeline is done with them, so the broker's in-flight window
// bounds how many can be here; held unmatched messages are capped by
// ReplayBufferSize.
type Inbox struct {
	s   Config
	m   *Metrics
	log Logger

	mu           sync.Mutex
	queue        []*Delivery // deliverable, oldest first
	qos0         int         // QoS 0 messages in queue
	qos0Retrying int         // QoS 0 messages in retries
	retries      []*Delivery // rejected, waiting for their due time
	conns        map[Conn]*connState
	pubrecs      *pubrecs
	wake         chan struct{} // closed and replaced when Read may have work
	closed       bool

	qos0Dropped  int // since the last warning
	qos0WarnedAt time.Time
}

// New returns an empty inbox. Every field of m must be set.
func New(s Config, m *Metrics, log Logger) *Inbox {
	return &Inbox{s: s, m: m, log: log, conns: map[Conn]*connState{}, pubrecs: newPubrecs(), wake: make(chan struct{})}
}

// signal wakes Read. Caller holds mu.
func (in *Inbox) signal() {
	close(in.wake)
	in.wake = make(chan struct{})
}

// stateFor returns the state of conn, creating it on its first message.
// Caller holds mu.
func (in *Inbox) stateFor(conn Conn) *connState {
	cs, ok := in.conns[conn]
	if ok {
		return cs
	}
	cs = &connState{conn: conn, pubrecs: in.pubrecs, m: in.m, inflight: map[uint16]struct{}{}, replayOver: in.s.CleanSession}
	if !conn.Alive() {
		// A late message of a connection already discarded: treat it as
		// gone, unacknowledged (the broker redelivers it).
		cs.gone = true
		return cs
	}
	in.conns[conn] = cs
	go in.watch(cs)
	return cs
}

// OnPubrel ends a QoS 2 exchange. It runs on the network reader.
func (in *Inbox) OnPubrel(id uint16) { in.pubrecs.released(id) }

// ResetSession forgets every open QoS 2 exchange: call it when the broker
// reports no session for the client (CONNACK session present = 0).
func (in *Inbox) ResetSession() { in.pubrecs.reset() }

// OnMessage routes one PUBLISH. It runs on the network reader, in receive
// order, and never blocks.
func (in *Inbox) OnMessage(conn Conn, msg mqttmsg.Message) {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return // not acknowledged: the broker keeps it for the next session
	}
	cs := in.stateFor(conn)
	if cs.gone {
		in.mu.Unlock()
		return
	}
	in.mu.Unlock()

	if msg.Qos() == 2 && in.pubrecs.retransmission(msg.MessageID(), msg.Duplicate()) {
		// PUBREC'd, PUBREL pending: answer with PUBREC again (in order),
		// never deliver it a second time.
		in.m.Duplicates.Incr(1)
		in.log.Debugf("Ignoring retransmission of QoS 2 packet %d on topic %q: already received, waiting for its PUBREL", msg.MessageID(), msg.Topic())
		entry := &ackEntry{msg: msg}
		in.appendSeq(cs, entry)
		cs.complete(entry, in.m)
		return
	}
	var entry *ackEntry
	if msg.Qos() > 0 {
		cs.mu.Lock()
		if _, dup := cs.inflight[msg.MessageID()]; dup {
			cs.mu.Unlock()
			in.m.Duplicates.Incr(1)
			in.log.Debugf("Ignoring retransmission of packet %d on topic %q: it is still being processed", msg.MessageID(), msg.Topic())
			return
		}
		cs.inflight[msg.MessageID()] = struct{}{}
		entry = &ackEntry{msg: msg}
		cs.mu.Unlock()
	}
	in.m.Received.Incr(1)

	sub, ok := in.s.Subs.Match(msg.Topic())
	if ok {
		in.appendSeq(cs, entry)
		in.enqueue(&Delivery{cs: cs, Msg: msg, Sub: sub.Raw, entry: entry})
		return
	}

	in.mu.Lock()
	if !cs.replayOver {
		in.hold(cs, &Delivery{cs: cs, Msg: msg, entry: entry})
		in.mu.Unlock()
		return
	}
	in.mu.Unlock()
	// Ordinary routing: no local recipient, so acknowledge and drop.
	in.m.Unmatched.Incr(1)
	in.log.Debugf("Acknowledging and dropping a message on topic %q: it matches none of topics %v", msg.Topic(), in.s.Topics)
	if entry != nil {
		in.appendSeq(cs, entry)
		cs.complete(entry, in.m)
	}
}

// enqueue hands a deliverable message to Next.
func (in *Inbox) enqueue(d *Delivery) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if d.qos() == 0 {
		// QoS 0 has no broker window to bound it: cap it here.
		if in.qos0 >= in.s.ReceiveBufferSize {
			in.dropOldestQoS0()
		}
		in.qos0++
	}
	in.queue = append(in.queue, d)
	in.setQueueGauges()
	in.signal()
}

// dropOldestQoS0 makes room for a QoS 0 message. Caller holds mu.
func (in *Inbox) dropOldestQoS0() {
	for i, d := range in.queue {
		if d.qos() != 0 {
			continue
		}
		in.queue = append(in.queue[:i], in.queue[i+1:]...)
		in.qos0--
		in.m.QoS0Dropped.Incr(1)
		in.qos0Dropped++
		if time.Since(in.qos0WarnedAt) >= 10*time.Second {
			in.log.Warnf("Dropped %d QoS 0 messages (oldest first, latest on topic %q): more than receive_buffer_size (%d) are waiting for the pipeline",
				in.qos0Dropped, d.Msg.Topic(), in.s.ReceiveBufferSize)
			in.qos0Dropped, in.qos0WarnedAt = 0, time.Now()
		}
		return
	}
}

// Next returns the delivery to emit now, or nil with a channel to wait on
// and the time of the next retry (zero when none); closed reports that
// Close was called. Due retries go first: they are older than anything
// queued.
func (in *Inbox) Next(now time.Time) (_ *Delivery, wake <-chan struct{}, nextDue time.Time, closed bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return nil, nil, time.Time{}, true
	}
	best := -1
	for i, d := range in.retries {
		if !d.due.After(now) {
			if best < 0 || d.due.Before(in.retries[best].due) {
				best = i
			}
		} else if nextDue.IsZero() || d.due.Before(nextDue) {
			nextDue = d.due
		}
	}
	if best >= 0 {
		d := in.retries[best]
		in.retries = append(in.retries[:best], in.retries[best+1:]...)
		if d.qos() == 0 {
			in.qos0Retrying--
		}
		return d, nil, time.Time{}, false
	}
	if len(in.queue) > 0 {
		d := in.queue[0]
		in.queue[0] = nil
		in.queue = in.queue[1:]
		if d.qos() == 0 {
			in.qos0--
		}
		in.setQueueGauges()
		return d, nil, time.Time{}, false
	}
	return nil, in.wake, nextDue, false
}

// ErrClosed is what Read returns once Close was called.
var ErrClosed = errors.New("inbox closed")

// Read waits, bounded by ctx, for the next delivery that is not stale (a
// stale one is skipped: the broker redelivers it on the next connection),
// its envelope decoded (Decoded); a malformed one is dropped unless
// FlagMalformed (see dropMalformed). It returns ErrClosed once Close was
// called.
func (in *Inbox) Read(ctx context.Context) (*Delivery, error) {
	for {
		d, wake, nextDue, closed := in.Next(time.Now())
		if closed {
			return nil, ErrClosed
		}
		if d != nil {
			if d.Stale() || in.dropMalformed(d) {
				continue
			}
			return d, nil
		}
		var timer *time.Timer
		var due <-chan time.Time
		if !nextDue.IsZero() {
			timer = time.NewTimer(time.Until(nextDue))
			due = timer.C
		}
		select {
		case <-wake:
		case <-due:
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// setQueueGauges reports the queue split at ReceiveBufferSize: up to it
// the receive buffer, beyond it the unacknowledged backlog that waits for
// Next to make room. Caller holds mu.
func (in *Inbox) setQueueGauges() {
	n := len(in.queue)
	in.m.Buffered.Set(int64(min(n, in.s.ReceiveBufferSize)))
	in.m.Backlog.Set(int64(max(n-in.s.ReceiveBufferSize, 0)))
}

// Close stops routing: later messages are not acknowledged, and queued or
// retrying deliveries are discarded (the broker keeps QoS 1/2 ones).
func (in *Inbox) Close() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return
	}
	in.closed = true
	for _, cs := range in.conns {
		if cs.timer != nil {
			cs.timer.Stop()
		}
	}
	in.queue, in.retries = nil, nil
	in.qos0, in.qos0Retrying = 0, 0
	in.signal()
}

// Queued returns the messages waiting for Next, oldest first (not those
// waiting for a retry): a snapshot for inspection.
func (in *Inbox) Queued() []mqttmsg.Message {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]mqttmsg.Message, len(in.queue))
	for i, d := range in.queue {
		out[i] = d.Msg
	}
	return out
}

// Retrying returns how many rejected deliveries wait for their retry, and
// how many of them are QoS 0 (bounded by ReceiveBufferSize).
func (in *Inbox) Retrying() (all, qos0 int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.retries), in.qos0Retrying
}
