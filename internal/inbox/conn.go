package inbox

import (
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// ackEntry is one QoS 1/2 message in a connection's ack order.
type ackEntry struct {
	msg  mqttmsg.Message
	done bool // the pipeline (or ordinary routing) is finished with it
}

// connState is what the inbox knows about one connection: its ack order
// and its startup replay.
type connState struct {
	conn    Conn
	pubrecs *pubrecs // the session's open QoS 2 exchanges
	m       *Metrics

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

	// Guarded by Inbox.mu.
	held       []*Delivery // unmatched messages kept unacknowledged during startup replay
	replayOver bool        // the replay timeout passed (or replay never applies): ordinary routing
	timer      *time.Timer
	gone       bool // lost or closed fail-closed: every later message is ignored, its state is discarded
}

// complete marks e done and sends every ack that is now due, in order.
// It is safe to call from any goroutine, including paho's network reader.
func (cs *connState) complete(e *ackEntry, m *Metrics) {
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
			m.Acked.Incr(int64(len(due)))
		}
		cs.mu.Lock()
		for _, d := range due {
			delete(cs.inflight, d.msg.MessageID())
		}
	}
}

// watch discards a connection's state when it is lost: its held messages
// and its queued or retrying QoS 1/2 deliveries, all unacknowledged, which
// the broker redelivers on the next connection. QoS 0 messages have no
// redelivery and stay.
func (in *Inbox) watch(cs *connState) {
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
func dropConn(ds []*Delivery, cs *connState) []*Delivery {
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

// appendSeq puts a QoS 1/2 message at the end of its connection's ack
// order. Called in receive order, from OnMessage only.
func (in *Inbox) appendSeq(cs *connState, e *ackEntry) {
	if e == nil {
		return
	}
	cs.mu.Lock()
	cs.seq = append(cs.seq, e)
	cs.mu.Unlock()
}
