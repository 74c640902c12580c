package mqttin

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

// scriptedBroker is a minimal MQTT 3.1.1 peer driven step by step by the
// test: real brokers never retransmit a PUBLISH on the same connection or
// send an unknown PUBREL on purpose, so these paths need a scripted peer.
type scriptedBroker struct {
	t   *testing.T
	ln  net.Listener
	got chan packets.ControlPacket

	mu   sync.Mutex
	conn net.Conn
}

func startScriptedBroker(t *testing.T) *scriptedBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sb := &scriptedBroker{t: t, ln: ln, got: make(chan packets.ControlPacket, 64)}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		sb.mu.Lock()
		if sb.conn != nil {
			_ = sb.conn.Close()
		}
		sb.mu.Unlock()
	})
	go func() {
		var c net.Conn
		select {
		case c = <-accepted:
		case <-time.After(10 * time.Second):
			return
		}
		sb.mu.Lock()
		sb.conn = c
		sb.mu.Unlock()
		for {
			p, err := packets.ReadPacket(c)
			if err != nil {
				close(sb.got)
				return
			}
			switch p := p.(type) {
			case *packets.ConnectPacket:
				sb.send(packets.NewControlPacket(packets.Connack))
			case *packets.SubscribePacket:
				ack := packets.NewControlPacket(packets.Suback).(*packets.SubackPacket)
				ack.MessageID = p.MessageID
				for range p.Topics {
					ack.ReturnCodes = append(ack.ReturnCodes, 2)
				}
				sb.send(ack)
			default:
				sb.got <- p
			}
		}
	}()
	return sb
}

func (sb *scriptedBroker) url() string { return "tcp://" + sb.ln.Addr().String() }

func (sb *scriptedBroker) send(p packets.ControlPacket) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := p.Write(sb.conn); err != nil {
		sb.t.Errorf("scripted broker write: %v", err)
	}
}

func (sb *scriptedBroker) publish(id uint16, dup bool, payload string) {
	p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
	p.Qos, p.MessageID, p.Dup, p.TopicName, p.Payload = 2, id, dup, "q/x", []byte(payload)
	sb.send(p)
}

func (sb *scriptedBroker) pubrel(id uint16) {
	p := packets.NewControlPacket(packets.Pubrel).(*packets.PubrelPacket)
	p.MessageID = id
	sb.send(p)
}

// expect returns the next packet the client sent, which must be of the
// given type and packet ID.
func (sb *scriptedBroker) expect(what string, id uint16) {
	sb.t.Helper()
	select {
	case p, ok := <-sb.got:
		if !ok {
			sb.t.Fatalf("connection closed while waiting for %s %d", what, id)
		}
		if p.String()[:len(what)] != what || p.Details().MessageID != id {
			sb.t.Fatalf("client sent %s, want %s for packet %d", p.String(), what, id)
		}
	case <-time.After(5 * time.Second):
		sb.t.Fatalf("client sent no %s for packet %d", what, id)
	}
}

// nothing asserts the client sent nothing for wait.
func (sb *scriptedBroker) nothing(wait time.Duration) {
	sb.t.Helper()
	select {
	case p := <-sb.got:
		sb.t.Fatalf("client sent %s, want nothing yet", p.String())
	case <-time.After(wait):
	}
}

// QoS 2: a PUBLISH retransmitted while its PUBREC is pending is delivered
// once; the PUBREC waits for the pipeline; an unknown PUBREL gets a PUBCOMP
// (paho answers every PUBREL itself); a packet ID reused after the exchange
// completed is a new message.
func TestQoS2RetransmissionDeliveredOnceAndUnknownPubrelCompleted(t *testing.T) {
	sb := startScriptedBroker(t)
	ti := openInput(t, inputYAML(sb.url(), "qos2", []string{"q/#"}, "qos: 2"))

	sb.publish(7, false, "one")
	sb.publish(7, true, "one") // retransmission, PUBREC still pending
	msg, ack := ti.read()
	if body(msg) != "one" || meta(msg, metaQoS) != "2" {
		t.Fatalf("read %q at qos %s", body(msg), meta(msg, metaQoS))
	}
	ti.readNone(300 * time.Millisecond)
	sb.nothing(100 * time.Millisecond) // no PUBREC before the pipeline acked

	sb.pubrel(99)
	sb.expect("PUBCOMP", 99)

	_ = ack(context.Background(), nil)
	sb.expect("PUBREC", 7)
	sb.pubrel(7)
	sb.expect("PUBCOMP", 7)

	sb.publish(7, false, "two")
	msg, ack = ti.read()
	if body(msg) != "two" {
		t.Fatalf("read %q, want the new message that reuses packet ID 7", body(msg))
	}
	_ = ack(context.Background(), nil)
	sb.expect("PUBREC", 7)
}
