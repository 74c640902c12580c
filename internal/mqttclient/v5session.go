package mqttclient

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session/state"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// v5Session is paho.golang's in-memory session state for one connection,
// with what the engines need on top: inbound PUBRELs are reported
// (OnPubrel), paho's automatic ack is ignored under manual ack, and a
// PUBREC's 0x10 is remembered for the QoS 2 publish it answers.
type v5Session struct {
	*state.State
	manual    bool
	onPubrel  func(id uint16)
	onConnack func(*packets.Connack)

	mu     sync.Mutex
	noSubs map[uint16]bool // QoS 2 packet IDs whose PUBREC said 0x10
}

// ConAckReceived runs when a CONNACK accepts the connection, before paho
// starts its reader and router.
func (s *v5Session) ConAckReceived(w io.Writer, cp *packets.Connect, ca *packets.Connack) error {
	s.onConnack(ca)
	return s.State.ConAckReceived(w, cp, ca)
}

// PacketReceived runs on paho's network reader for every packet with a
// packet ID.
func (s *v5Session) PacketReceived(p *packets.ControlPacket, pubs chan<- *packets.Publish) error {
	switch r := p.Content.(type) {
	case *packets.Pubrel:
		if s.onPubrel != nil {
			s.onPubrel(r.PacketID)
		}
	case *packets.Pubrec:
		if r.ReasonCode == ReasonNoMatchingSubscribers {
			s.mu.Lock()
			s.noSubs[r.PacketID] = true
			s.mu.Unlock()
		}
	}
	return s.State.PacketReceived(p, pubs)
}

// Ack is paho's acknowledgement after the handlers ran; under manual ack
// Message.Ack sends it instead.
func (s *v5Session) Ack(pb *packets.Publish) error {
	if s.manual {
		return nil
	}
	return s.State.Ack(pb)
}

// result turns the final answer to a QoS 1/2 publish into its outcome.
func (s *v5Session) result(t *v5Token, resp packets.ControlPacket) error {
	var code byte
	var props *packets.Properties
	var name string
	switch r := resp.Content.(type) {
	case *packets.Puback:
		code, props, name = r.ReasonCode, r.Properties, "PUBACK"
	case *packets.Pubrec: // only a failing PUBREC ends a QoS 2 publish
		code, props, name = r.ReasonCode, r.Properties, "PUBREC"
	case *packets.Pubcomp:
		code, props, name = r.ReasonCode, r.Properties, "PUBCOMP"
		s.mu.Lock()
		if code < 0x80 && s.noSubs[t.pb.PacketID] {
			code, props, name = ReasonNoMatchingSubscribers, nil, "PUBREC"
		}
		delete(s.noSubs, t.pb.PacketID)
		s.mu.Unlock()
	default: // the state's zero packet: dropped from the session
		return ErrNotConnected
	}
	if code < 0x80 && !(code == ReasonNoMatchingSubscribers && t.requireSubs) {
		return nil
	}
	e := &ReasonCodeError{Packet: name, Code: code}
	if props != nil {
		e.Reason = props.ReasonString
	}
	if e.Reason == "" {
		e.Reason = reasonName(code)
	}
	return fmt.Errorf("mqtt: publish to %q: %w", t.pb.Topic, e)
}

// reasonName is the protocol's name for a PUBACK/PUBREC reason code, for
// a server that sends no reason string.
func reasonName(code byte) string {
	return (&packets.Puback{ReasonCode: code}).Reason()
}

// v5Message is a received MQTT 5 PUBLISH.
type v5Message struct {
	conn  *v5Conn
	p     *paho.Publish
	props *mqttmsg.Properties
	acked atomic.Bool // Ack sends at most once, as paho.mqtt.golang's does
}

func (m *v5Message) Topic() string                   { return m.p.Topic }
func (m *v5Message) Qos() byte                       { return m.p.QoS }
func (m *v5Message) MessageID() uint16               { return m.p.PacketID }
func (m *v5Message) Duplicate() bool                 { return m.p.Duplicate() }
func (m *v5Message) Retained() bool                  { return m.p.Retain }
func (m *v5Message) Payload() []byte                 { return m.p.Payload }
func (m *v5Message) Properties() *mqttmsg.Properties { return m.props }

// Ack sends the PUBACK/PUBREC now under Options.ManualAck (paho already
// acknowledged it otherwise). An ack for a message of a lost connection
// goes nowhere: its Conn is no longer alive, and its socket and session
// state are not the next connection's.
func (m *v5Message) Ack() {
	c := m.conn
	if !c.session.manual || !c.Alive() || m.acked.Swap(true) {
		return
	}
	switch m.p.QoS {
	case 1: // the session state only writes it, in four calls
		_ = c.write(&packets.Puback{PacketID: m.p.PacketID, Properties: &packets.Properties{}})
	case 2: // the state also records the PUBREC
		_ = c.session.State.Ack(&packets.Publish{QoS: 2, PacketID: m.p.PacketID})
	}
}
