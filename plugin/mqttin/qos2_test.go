package mqttin

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// scriptedBroker is a minimal MQTT 3.1.1 peer driven step by step by the
// test: real brokers never retransmit a PUBLISH on the same connection or
// send an unknown PUBREL on purpose, so these paths need a scripted peer.
// It accepts any number of connections one after another (drop ends the
// current one); from the second on, its CONNACK says session present.
type scriptedBroker struct {
	t   *testing.T
	ln  net.Listener
	got chan packets.ControlPacket

	mu    sync.Mutex
	conn  net.Conn
	conns int
}

func startScriptedBroker(t *testing.T) *scriptedBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sb := &scriptedBroker{t: t, ln: ln, got: make(chan packets.ControlPacket, 64)}
	t.Cleanup(func() {
		_ = ln.Close()
		sb.drop()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed at cleanup
			}
			sb.mu.Lock()
			sb.conn = c
			sb.conns++
			present := sb.conns > 1
			sb.mu.Unlock()
			go sb.serve(c, present)
		}
	}()
	return sb
}

// serve reads one connection's packets until it ends.
func (sb *scriptedBroker) serve(c net.Conn, sessionPresent bool) {
	for {
		p, err := packets.ReadPacket(c)
		if err != nil {
			return
		}
		switch p := p.(type) {
		case *packets.ConnectPacket:
			ack := packets.NewControlPacket(packets.Connack).(*packets.ConnackPacket)
			ack.SessionPresent = sessionPresent
			sb.send(ack)
		case *packets.SubscribePacket:
			ack := packets.NewControlPacket(packets.Suback).(*packets.SubackPacket)
			ack.MessageID = p.MessageID
			for range p.Topics {
				ack.ReturnCodes = append(ack.ReturnCodes, 2)
			}
			sb.send(ack)
		case *packets.PingreqPacket:
			sb.send(packets.NewControlPacket(packets.Pingresp))
		default:
			sb.got <- p
		}
	}
}

// drop closes the current connection, as a network failure would.
func (sb *scriptedBroker) drop() {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.conn != nil {
		_ = sb.conn.Close()
	}
}

// connections is how many connections were accepted so far.
func (sb *scriptedBroker) connections() int {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.conns
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
			sb.t.Fatalf("scripted broker stopped while waiting for %s %d", what, id)
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

// QoS 2 exactly once into the pipeline (MQTT-4.3.3-2): a PUBLISH resent
// with DUP=1 after its PUBREC, on the same connection and again on the next
// connection of the session, is answered with PUBREC and not delivered;
// after the PUBREL the packet ID is free and a new message reusing it is
// delivered. The pipeline sees each message once.
func TestQoS2ResentAfterPubrecIsDeliveredOnceAcrossReconnects(t *testing.T) {
	sb := startScriptedBroker(t)
	ti := openInput(t, inputYAML(sb.url(), "qos2-session", []string{"q/#"}, "qos: 2"))

	sb.publish(5, false, "one")
	msg, ack := ti.read()
	if body(msg) != "one" {
		t.Fatalf("read %q", body(msg))
	}
	_ = ack(context.Background(), nil)
	sb.expect("PUBREC", 5)

	sb.publish(5, true, "one") // same connection: our PUBREC "was lost"
	sb.expect("PUBREC", 5)
	ti.readNone(300 * time.Millisecond)

	conn := ti.in.client.Current()
	sb.drop()
	harness.Eventually(t, 10*time.Second, "a second connection", func() bool { return sb.connections() >= 2 && ti.in.client.Current() != conn })
	sb.publish(5, true, "one") // the next connection of the session
	sb.expect("PUBREC", 5)
	ti.readNone(300 * time.Millisecond)

	sb.pubrel(5)
	sb.expect("PUBCOMP", 5)
	sb.publish(5, false, "two") // the ID reused after the exchange ended
	msg, ack = ti.read()
	if body(msg) != "two" {
		t.Fatalf("read %q, want the new message reusing packet ID 5", body(msg))
	}
	_ = ack(context.Background(), nil)
	sb.expect("PUBREC", 5)
}

// The open QoS 2 exchanges are not kept across a process restart (see
// pubrecs): a PUBLISH resent after a restart is delivered again, at least
// once like every message of this input, for dedup_ledger to recognise.
func TestQoS2ResentAfterARestartIsDeliveredAgain(t *testing.T) {
	sb := startScriptedBroker(t)
	ti := openInput(t, inputYAML(sb.url(), "qos2-restart", []string{"q/#"}, "qos: 2"))
	sb.publish(9, false, "one")
	_, ack := ti.read()
	_ = ack(context.Background(), nil)
	sb.expect("PUBREC", 9)
	ti.close()

	ti = openInput(t, inputYAML(sb.url(), "qos2-restart", []string{"q/#"}, "qos: 2"))
	sb.publish(9, true, "one")
	if msg, _ := ti.read(); body(msg) != "one" {
		t.Fatalf("read %q after the restart, want the resent message", body(msg))
	}
}
