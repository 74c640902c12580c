package sender

import (
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
)

// Receive queues a valid ACK and ignores, by reason, a malformed one and
// one not signed with a configured key.
func TestReceiveACKs(t *testing.T) {
	m := &testMetrics{ignored: map[string]int{}}
	q := NewAckQueue()
	ign := NewIgnoredACKs(m, &testLog{})
	key := []byte("k1")
	plain, _ := envelope.EncodeAck("e1")
	signed, _ := envelope.EncodeAuthAck("e2", key)
	forged, _ := envelope.EncodeAuthAck("e3", []byte("other"))

	q.Receive("acks", plain, nil, ign) // no keys: accepted
	q.Receive("acks", []byte("{"), nil, ign)
	q.Receive("acks", signed, [][]byte{key}, ign)
	q.Receive("acks", forged, [][]byte{key}, ign)
	q.Receive("acks", plain, [][]byte{key}, ign) // unsigned, keys set

	if got := q.drain(); len(got) != 2 || got[0] != "e1" || got[1] != "e2" {
		t.Errorf("queued %v, want [e1 e2]", got)
	}
	if m.ignored[ReasonMalformed] != 1 || m.ignored[ReasonUnauthenticated] != 2 {
		t.Errorf("ignored %v, want 1 malformed and 2 unauthenticated", m.ignored)
	}
}
