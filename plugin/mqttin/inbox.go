package mqttin

import (
	"fmt"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
)

// delivery is one received PUBLISH on its way through the pipeline. A
// rejected delivery goes round again (a new attempt) until it succeeds or
// its connection is lost.
type delivery struct {
	cs       *connState
	msg      paho.Message
	sub      string    // the configured filter that matched
	entry    *ackEntry // its place in the connection's ack order; nil for QoS 0
	attempts int       // failed attempts so far
	due      time.Time // when a rejected delivery may be read again

	decoded *decoded // the envelope, decoded at the first Read
}

func (d *delivery) qos() byte { return d.msg.Qos() }

// ackEntry is one QoS 1/2 message in a connection's ack order.
type ackEntry struct {
	msg  paho.Message
	done bool // the pipeline (or ordinary routing) is finished with it
}

// connState is what the input knows about one connection (one
// mqttclient.Conn): its ack order and its startup replay.
type connState struct {
	conn    *mqttclient.Conn
	pubrecs *pubrecs // the session's open QoS 2 exchanges

	// mu guards the ack order.
	//
	// Invariant (MQTT 3.1.1 §4.6): PUBACK/PUBREC packets leave in the order
	// their PUBLISHes arrived. seq holds every QoS 1/2 message that will be
	// acknowledged, in receive order; an entry's ack is sent only when it
	// and every entry before it are done, by one sender at a time. Messages
	// that are never acknowledged (held and dropped in startup replay) are
	// not in seq, so they do not block the others.
	mu      sync.Mutex
	seq     []*ackEntry
	sending bool
	// inflight holds the packet IDs received and not yet acknowledged. The
	// broker cannot reuse such an ID, so a PUBLISH carrying one is a
	// retransmission and must not be delivered a second time.
	inflight map[uint16]struct{}

	// Guarded by inbox.mu.
	held       []*delivery // unmatched messages kept unacknowledged during startup replay
	replayOver bool        // the replay timeout passed (or replay never applies): ordinary routing
	timer      *time.Timer
	gone       bool // lost or closed fail-closed: every later message is ignored, its state is discarded
}

// complete marks e done and sends every ack that is now due, in order.
// It is safe to call from any goroutine, including paho's network reader.
func (cs *connState) complete(e *ackEntry, m *metrics) {
	cs.mu.Lock()
	e.done = true
	if cs.sending {
		cs.mu.Unlock() // the active sender will pick it up
		return
	}
	cs.sending = true
	for {
		var due []*ackEntry
		for len(cs.seq) > 0 && cs.seq[0].done {
			due = append(due, cs.seq[0])
			cs.seq[0] = nil
			cs.seq = cs.seq[1:]
		}
		if len(due) == 0 {
			cs.sending = false
			cs.mu.Unlock()
			return
		}
		cs.mu.Unlock()
		// Ack outside the lock: paho may block briefly while its writer is
		// busy. On a lost connection the ack goes nowhere, on purpose: the
		// broker redelivers the message on the next connection.
		if cs.conn.Alive() {
			for _, d := range due {
				d.msg.Ack()
				if d.msg.Qos() == 2 {
					cs.pubrecs.sent(d.msg.MessageID())
				}
			}
			m.acked.Incr(int64(len(due)))
		}
		cs.mu.Lock()
		for _, d := range due {
			delete(cs.inflight, d.msg.MessageID())
		}
	}
}

// inbox sits between paho's network reader and Read. OnMessage must never
// block, so everything it does is a few slice operations under mu.
//
// Memory is bounded: QoS 0 messages are capped at receiveBufferSize (the
// oldest is dropped beyond it); QoS 1/2 messages are never acknowledged
// before the pipeline is done with them, so the broker's in-flight window
// bounds how many can be here; held unmatched messages are capped by
// session_replay_buffer_size.
type inbox struct {
	s   settings
	m   *metrics
	log *service.Logger

	mu           sync.Mutex
	queue        []*delivery // deliverable, oldest first
	qos0         int         // QoS 0 messages in queue
	qos0Retrying int         // QoS 0 messages in retries
	retries      []*delivery // rejected, waiting for their due time
	conns        map[*mqttclient.Conn]*connState
	pubrecs      *pubrecs
	wake         chan struct{} // closed and replaced when Read may have work
	closed       bool

	qos0Dropped  int // since the last warning
	qos0WarnedAt time.Time
}

func newInbox(s settings, m *metrics, log *service.Logger) *inbox {
	return &inbox{s: s, m: m, log: log, conns: map[*mqttclient.Conn]*connState{}, pubrecs: newPubrecs(), wake: make(chan struct{})}
}

// signal wakes Read. Caller holds mu.
func (in *inbox) signal() {
	close(in.wake)
	in.wake = make(chan struct{})
}

// stateFor returns the state of conn, creating it on its first message.
// Caller holds mu.
func (in *inbox) stateFor(conn *mqttclient.Conn) *connState {
	cs, ok := in.conns[conn]
	if ok {
		return cs
	}
	cs = &connState{conn: conn, pubrecs: in.pubrecs, inflight: map[uint16]struct{}{}, replayOver: in.s.client.CleanSession}
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

// watch discards a connection's state when it is lost: its held messages
// and its queued or retrying QoS 1/2 deliveries, all unacknowledged, which
// the broker redelivers on the next connection. QoS 0 messages have no
// redelivery and stay.
func (in *inbox) watch(cs *connState) {
	<-cs.conn.Lost()
	in.mu.Lock()
	defer in.mu.Unlock()
	cs.gone = true
	if cs.timer != nil {
		cs.timer.Stop()
	}
	cs.held = nil
	delete(in.conns, cs.conn)
	in.setHeldGauge()
	in.queue = dropConn(in.queue, cs)
	in.retries = dropConn(in.retries, cs)
	in.setQueueGauges()
}

// dropConn removes the QoS 1/2 deliveries of cs from ds.
func dropConn(ds []*delivery, cs *connState) []*delivery {
	out := ds[:0]
	for _, d := range ds {
		if d.cs == cs && d.qos() > 0 {
			continue
		}
		out = append(out, d)
	}
	clear(ds[len(out):])
	return out
}

// onPubrel ends a QoS 2 exchange. It runs on paho's network reader.
func (in *inbox) onPubrel(_ *mqttclient.Conn, id uint16) { in.pubrecs.released(id) }

// onMessage routes one PUBLISH. It runs on paho's network reader, in
// receive order, and never blocks.
func (in *inbox) onMessage(conn *mqttclient.Conn, msg paho.Message) {
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
		in.m.duplicates.Incr(1)
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
			in.m.duplicates.Incr(1)
			in.log.Debugf("Ignoring retransmission of packet %d on topic %q: it is still being processed", msg.MessageID(), msg.Topic())
			return
		}
		cs.inflight[msg.MessageID()] = struct{}{}
		entry = &ackEntry{msg: msg}
		cs.mu.Unlock()
	}
	in.m.received.Incr(1)

	sub, ok := in.s.subs.match(msg.Topic())
	if ok {
		in.appendSeq(cs, entry)
		in.enqueue(&delivery{cs: cs, msg: msg, sub: sub.raw, entry: entry})
		return
	}

	in.mu.Lock()
	if !cs.replayOver {
		in.hold(cs, &delivery{cs: cs, msg: msg, entry: entry})
		in.mu.Unlock()
		return
	}
	in.mu.Unlock()
	// Ordinary routing: no local recipient, so acknowledge and drop.
	in.m.unmatched.Incr(1)
	in.log.Debugf("Acknowledging and dropping a message on topic %q: it matches none of topics %v", msg.Topic(), in.s.topics)
	if entry != nil {
		in.appendSeq(cs, entry)
		cs.complete(entry, in.m)
	}
}

// appendSeq puts a QoS 1/2 message at the end of its connection's ack
// order. Called in receive order, from onMessage only.
func (in *inbox) appendSeq(cs *connState, e *ackEntry) {
	if e == nil {
		return
	}
	cs.mu.Lock()
	cs.seq = append(cs.seq, e)
	cs.mu.Unlock()
}

// hold keeps an unmatched message of a resumed session, unacknowledged,
// until the replay timeout. Caller holds mu.
func (in *inbox) hold(cs *connState, d *delivery) {
	limit := in.s.replayBufferSize
	if limit > 0 && len(cs.held) >= limit {
		in.failClosed(cs, d)
		return
	}
	cs.held = append(cs.held, d)
	in.setHeldGauge()
	in.m.heldTotal.Incr(1)
	if cs.timer == nil {
		// Measured from the first held message and never extended.
		cs.timer = time.AfterFunc(in.s.replayTimeout, func() { in.endReplay(cs) })
	}
}

// failClosed closes a connection whose unmatched replay overflowed
// session_replay_buffer_size, acknowledging nothing: the messages stay in
// the broker's session. Caller holds mu.
func (in *inbox) failClosed(cs *connState, d *delivery) {
	cs.gone = true
	if cs.timer != nil {
		cs.timer.Stop()
	}
	n := len(cs.held)
	cs.held = nil
	in.setHeldGauge()
	in.m.replayOverflows.Incr(1)
	err := fmt.Errorf("startup replay overflow: more than session_replay_buffer_size (%d) messages of the resumed session of client %q match none of topics %v (the latest on %q); closing the connection without acknowledging any of them, so they stay queued at the broker. Add the topics they belong to, raise session_replay_buffer_size (0 = unbounded), or clear the old subscriptions of this session",
		in.s.replayBufferSize, in.s.client.ClientID, in.s.topics, d.msg.Topic())
	in.log.Errorf("%v (%d held messages discarded locally)", err, n)
	cs.conn.Drop(err)
}

// endReplay runs when a connection's replay timeout expires. Subscriptions
// never change after connect, so no held message has gained a recipient:
// every held message is dropped locally, without PUBACK or PUBREC, and the
// connection switches to ordinary routing.
func (in *inbox) endReplay(cs *connState) {
	in.mu.Lock()
	if cs.gone {
		in.mu.Unlock()
		return
	}
	cs.replayOver = true
	dropped := cs.held
	cs.held = nil
	in.setHeldGauge()
	in.mu.Unlock()
	if len(dropped) == 0 {
		return
	}
	in.m.droppedUnacked.Incr(int64(len(dropped)))
	in.log.Warnf("session_replay_timeout (%s) passed: dropping %d held messages (first on topic %q) locally without acknowledging them, since they match none of topics %v. The broker keeps QoS 1/2 ones and redelivers them on the next resumed connection; until then they occupy its in-flight window",
		in.s.replayTimeout, len(dropped), dropped[0].msg.Topic(), in.s.topics)
}

// enqueue hands a deliverable message to Read.
func (in *inbox) enqueue(d *delivery) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if d.qos() == 0 {
		// QoS 0 has no broker window to bound it: cap it here.
		if in.qos0 >= in.s.receiveBufferSize {
			in.dropOldestQoS0()
		}
		in.qos0++
	}
	in.queue = append(in.queue, d)
	in.setQueueGauges()
	in.signal()
}

// dropOldestQoS0 makes room for a QoS 0 message. Caller holds mu.
func (in *inbox) dropOldestQoS0() {
	for i, d := range in.queue {
		if d.qos() != 0 {
			continue
		}
		in.queue = append(in.queue[:i], in.queue[i+1:]...)
		in.qos0--
		in.m.qos0Dropped.Incr(1)
		in.qos0Dropped++
		if time.Since(in.qos0WarnedAt) >= 10*time.Second {
			in.log.Warnf("Dropped %d QoS 0 messages (oldest first, latest on topic %q): more than receive_buffer_size (%d) are waiting for the pipeline",
				in.qos0Dropped, d.msg.Topic(), in.s.receiveBufferSize)
			in.qos0Dropped, in.qos0WarnedAt = 0, time.Now()
		}
		return
	}
}

// retry schedules a rejected delivery for another attempt after a backoff
// that doubles per attempt. A QoS 1/2 delivery of a lost connection is
// dropped instead: the broker redelivers it on the next connection.
func (in *inbox) retry(d *delivery) {
	d.attempts++
	wait := in.s.retry.Initial
	for i := 1; i < d.attempts && wait < in.s.retry.Max; i++ {
		wait = in.s.retry.Next(wait)
	}
	d.due = time.Now().Add(wait)
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed || (d.qos() > 0 && (d.cs.gone || !d.cs.conn.Alive())) {
		return
	}
	if d.qos() == 0 {
		// QoS 0 has no broker window: bound its retries like its queue.
		if in.qos0Retrying >= in.s.receiveBufferSize {
			in.m.qos0Dropped.Incr(1)
			in.log.Warnf("Dropping a rejected QoS 0 message on topic %q: %d QoS 0 messages already wait for a retry (receive_buffer_size)", d.msg.Topic(), in.qos0Retrying)
			return
		}
		in.qos0Retrying++
	}
	in.m.retried.Incr(1)
	in.retries = append(in.retries, d)
	in.signal()
}

// next returns the delivery Read should emit now, or nil with a channel
// to wait on and the time of the next retry (zero when none). Due retries
// go first: they are older than anything queued.
func (in *inbox) next(now time.Time) (*delivery, <-chan struct{}, time.Time, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return nil, nil, time.Time{}, true
	}
	var nextDue time.Time
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

// setHeldGauge reports the messages held now across connections. Caller
// holds mu.
func (in *inbox) setHeldGauge() {
	n := 0
	for _, cs := range in.conns {
		n += len(cs.held)
	}
	in.m.held.Set(int64(n))
}

// setQueueGauges reports the queue split at receive_buffer_size: up to it
// the receive buffer, beyond it the unacknowledged backlog that waits for
// Read to make room. Caller holds mu.
func (in *inbox) setQueueGauges() {
	n := len(in.queue)
	in.m.buffered.Set(int64(min(n, in.s.receiveBufferSize)))
	in.m.backlog.Set(int64(max(n-in.s.receiveBufferSize, 0)))
}

// close stops routing: later messages are not acknowledged, and queued or
// retrying deliveries are discarded (the broker keeps QoS 1/2 ones).
func (in *inbox) close() {
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
