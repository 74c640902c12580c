package inbox

import "sync"

// pubrecs holds the packet IDs of QoS 2 messages this input has PUBREC'd and
// whose PUBREL has not arrived: the exchange is still open (MQTT-4.3.3-2),
// so a PUBLISH with such an ID is a retransmission, not a new message. It
// belongs to the session, not to one connection: a PUBREC lost with a
// dropped connection makes the broker resend the PUBLISH (DUP=1) on the
// next one.
//
// It is not kept across a process restart: the input holds no file of its
// own, and a durable record would need an fsync before every PUBREC. A QoS
// 2 message resent after a restart is delivered again, which is the
// at-least-once contract of every message of this input (dedup_ledger
// recognises it by its event ID).
type pubrecs struct {
	mu  sync.Mutex
	ids map[uint16]struct{}
}

func newPubrecs() *pubrecs { return &pubrecs{ids: map[uint16]struct{}{}} }

// sent records a PUBREC for id.
func (p *pubrecs) sent(id uint16) {
	p.mu.Lock()
	p.ids[id] = struct{}{}
	p.mu.Unlock()
}

// released ends id's exchange (its PUBREL arrived): the broker may reuse id.
func (p *pubrecs) released(id uint16) {
	p.mu.Lock()
	delete(p.ids, id)
	p.mu.Unlock()
}

// retransmission reports whether a QoS 2 PUBLISH with id and the DUP flag
// dup repeats a PUBREC'd message. Only a PUBLISH with DUP=1 can: a broker
// that sends DUP=0 with the ID considers the old exchange finished (our
// record of it is stale, e.g. a session the broker lost), so the record is
// dropped and the message is new.
func (p *pubrecs) retransmission(id uint16, dup bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, open := p.ids[id]
	if open && !dup {
		delete(p.ids, id)
		return false
	}
	return open
}

// reset forgets every exchange: the broker has no session for us.
func (p *pubrecs) reset() {
	p.mu.Lock()
	clear(p.ids)
	p.mu.Unlock()
}
