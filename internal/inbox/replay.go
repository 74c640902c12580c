package inbox

import (
	"fmt"
	"time"
)

// hold keeps an unmatched message of a resumed session, unacknowledged,
// until the replay timeout. Caller holds mu.
func (in *Inbox) hold(cs *connState, d *Delivery) {
	limit := in.s.ReplayBufferSize
	if limit > 0 && len(cs.held) >= limit {
		in.failClosed(cs, d)
		return
	}
	cs.held = append(cs.held, d)
	in.setHeldGauge()
	in.m.HeldTotal.Incr(1)
	if cs.timer == nil {
		// Measured from the first held message and never extended.
		cs.timer = time.AfterFunc(in.s.ReplayTimeout, func() { in.endReplay(cs) })
	}
}

// failClosed closes a connection whose unmatched replay overflowed
// session_replay_buffer_size, acknowledging nothing: the messages stay in
// the broker's session. Caller holds mu.
func (in *Inbox) failClosed(cs *connState, d *Delivery) {
	cs.gone = true
	if cs.timer != nil {
		cs.timer.Stop()
	}
	n := len(cs.held)
	cs.held = nil
	in.setHeldGauge()
	in.m.ReplayOverflows.Incr(1)
	err := fmt.Errorf("startup replay overflow: more than session_replay_buffer_size (%d) messages of the resumed session of client %q match none of topics %v (the latest on %q); closing the connection without acknowledging any of them, so they stay queued at the broker. Add the topics they belong to, raise session_replay_buffer_size (0 = unbounded), or clear the old subscriptions of this session",
		in.s.ReplayBufferSize, in.s.ClientID, in.s.Topics, d.Msg.Topic())
	in.log.Errorf("%v (%d held messages discarded locally)", err, n)
	cs.conn.Drop(err)
}

// endReplay runs when a connection's replay timeout expires. Subscriptions
// never change after connect, so no held message has gained a recipient:
// every held message is dropped locally, without PUBACK or PUBREC, and the
// connection switches to ordinary routing.
func (in *Inbox) endReplay(cs *connState) {
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
	in.m.DroppedUnacked.Incr(int64(len(dropped)))
	in.log.Warnf("session_replay_timeout (%s) passed: dropping %d held messages (first on topic %q) locally without acknowledging them, since they match none of topics %v. The broker keeps QoS 1/2 ones and redelivers them on the next resumed connection; until then they occupy its in-flight window",
		in.s.ReplayTimeout, len(dropped), dropped[0].Msg.Topic(), in.s.Topics)
}

// setHeldGauge reports the messages held now across connections. Caller
// holds mu.
func (in *Inbox) setHeldGauge() {
	n := 0
	for _, cs := range in.conns {
		n += len(cs.held)
	}
	in.m.Held.Set(int64(n))
}
