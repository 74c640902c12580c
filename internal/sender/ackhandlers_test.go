package sender

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// subscribeConn records the filters it is asked to subscribe to.
type subscribeConn struct {
	mqttclient.Conn
	filters []map[string]byte
}

func (c *subscribeConn) Subscribe(_ context.Context, f map[string]byte) error {
	c.filters = append(c.filters, f)
	return nil
}

type ackMessage struct {
	topic    string
	payload  []byte
	retained bool
}

func (m ackMessage) Topic() string                   { return m.topic }
func (m ackMessage) Qos() byte                       { return 1 }
func (m ackMessage) MessageID() uint16               { return 1 }
func (m ackMessage) Duplicate() bool                 { return false }
func (m ackMessage) Retained() bool                  { return m.retained }
func (m ackMessage) Payload() []byte                 { return m.payload }
func (m ackMessage) Properties() *mqttmsg.Properties { return nil }
func (m ackMessage) Ack()                            {}

func TestAckHandlersSubscribeAtConnectAndQueueEveryACK(t *testing.T) {
	m := &testMetrics{ignored: map[string]int{}}
	log := &testLog{}
	acks := NewAckQueue()
	warnings := 0
	h := AckHandlers("acks/t", nil, acks, NewIgnoredACKs(m, log), log, func() bool { warnings++; return warnings == 1 })

	conn := &subscribeConn{}
	for range 2 { // every connect subscribes again
		if err := h.OnConnect(context.Background(), conn); err != nil {
			t.Fatal(err)
		}
	}
	if len(conn.filters) != 2 || conn.filters[1]["acks/t"] != 1 || len(conn.filters[1]) != 1 {
		t.Fatalf("subscriptions %v, want acks/t at QoS 1 at each connect", conn.filters)
	}

	ack, err := envelope.EncodeAck("ev-1")
	if err != nil {
		t.Fatal(err)
	}
	h.OnMessage(conn, ackMessage{topic: "acks/t", payload: ack})
	h.OnMessage(conn, ackMessage{topic: "acks/t", payload: []byte("not an ack")})
	h.OnMessage(conn, ackMessage{topic: "acks/t", payload: ack, retained: true})
	h.OnMessage(conn, ackMessage{topic: "acks/t", payload: ack, retained: true})
	if got := acks.drain(); !slices.Equal(got, []string{"ev-1", "ev-1", "ev-1"}) {
		t.Fatalf("queued %v, want the three ACKs of ev-1", got)
	}
	if m.ignored[ReasonMalformed] != 1 {
		t.Fatalf("ignored %v, want one malformed", m.ignored)
	}
	retained := 0
	for _, l := range log.lines {
		if strings.Contains(l, "retained message arrived on the ACK topic") {
			retained++
		}
	}
	if retained != 1 || warnings != 2 {
		t.Fatalf("%d retained warnings logged after %d asked, want 1 of 2: %q", retained, warnings, log.lines)
	}
}
