package inbox

import (
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// Delivery is one received PUBLISH on its way through the pipeline. A
// rejected delivery goes round again (a new attempt, see Retry) until it
// succeeds (Complete) or its connection is lost.
type Delivery struct {
	Msg mqttmsg.Message
	Sub string // the configured filter that matched
	// Decoded is Msg's envelope, decoded at its first Read and kept across
	// attempts; nil before.
	Decoded *codec.Decoded

	cs       *connState
	entry    *ackEntry // its place in the connection's ack order; nil for QoS 0
	attempts int       // failed attempts so far
	due      time.Time // when a rejected delivery may be read again
}

func (d *Delivery) qos() byte { return d.Msg.Qos() }

// Conn is the connection the message arrived on.
func (d *Delivery) Conn() Conn { return d.cs.conn }

// Stale reports whether the broker redelivers d on a later connection
// anyway: a QoS 1/2 message whose connection is lost must not be processed.
func (d *Delivery) Stale() bool { return d.qos() > 0 && !d.cs.conn.Alive() }

// Retry schedules a rejected delivery for another attempt after a backoff
// that doubles per attempt. A QoS 1/2 delivery of a lost connection is
// dropped instead: the broker redelivers it on the next connection.
func (in *Inbox) Retry(d *Delivery) {
	d.attempts++
	d.due = time.Now().Add(in.s.Retry.After(d.attempts))
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed || (d.qos() > 0 && (d.cs.gone || !d.cs.conn.Alive())) {
		return
	}
	if d.qos() == 0 {
		// QoS 0 has no broker window: bound its retries like its queue.
		if in.qos0Retrying >= in.s.ReceiveBufferSize {
			in.m.QoS0Dropped.Incr(1)
			in.log.Warnf("Dropping a rejected QoS 0 message on topic %q: %d QoS 0 messages already wait for a retry (receive_buffer_size)", d.Msg.Topic(), in.qos0Retrying)
			return
		}
		in.qos0Retrying++
	}
	in.m.Retried.Incr(1)
	in.retries = append(in.retries, d)
	in.signal()
}

// Complete marks the pipeline done with d and sends every PUBACK/PUBREC of
// its connection that is now due, in receive order. QoS 0 has none. Safe
// from any goroutine.
func (d *Delivery) Complete() {
	if d.entry != nil {
		d.cs.complete(d.entry, d.cs.m)
	}
}
