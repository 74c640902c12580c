package harness

import (
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
)

// Acker is a test end-to-end consumer: it receives reliomq v1 ingress
// envelopes on a data topic and answers each with an ACK carrying its
// event ID, like a bridge that delivered the message. Reply decides what is
// sent for each envelope (nil: one correct ACK), so tests can forge
// wrong-ID, duplicate and late ACKs. A frame (internal/frame: a packing
// output's, or a bridge's that forwards frames) counts as its events, each
// seen as an envelope, and is answered with one ACK naming the frame.
type Acker struct {
	t      testing.TB
	client mqtt.Client
	reply  func(in envelope.Ingress) [][]byte

	mu     sync.Mutex
	seen   []envelope.Ingress
	bad    int
	frames int
}

// StartAcker subscribes to dataTopic on url and ACKs on ackTopic.
func StartAcker(t testing.TB, url, dataTopic, ackTopic string, reply func(in envelope.Ingress) [][]byte) *Acker {
	t.Helper()
	a := &Acker{t: t, reply: reply}
	ready := make(chan error, 1)
	opts := mqtt.NewClientOptions().
		AddBroker(url).
		SetClientID("harness-acker-" + randomHex(6)).
		SetCleanSession(true).
		SetOrderMatters(false). // handlers publish and wait: keep them off the reader
		SetAutoReconnect(true).
		SetMaxReconnectInterval(time.Second).
		SetConnectTimeout(5 * time.Second).
		SetOnConnectHandler(func(c mqtt.Client) {
			err := subackErr(c.Subscribe(dataTopic, 1, func(c mqtt.Client, m mqtt.Message) { a.handle(c, ackTopic, m) }))
			select {
			case ready <- err:
			default:
			}
		})
	a.client = mqtt.NewClient(opts)
	t.Cleanup(a.Close)
	tok := a.client.Connect()
	if !tok.WaitTimeout(clientTimeout) {
		t.Fatalf("harness: acker: no CONNACK from %s within %s", url, clientTimeout)
	}
	if err := tok.Error(); err != nil {
		t.Fatalf("harness: acker: connect to %s: %v", url, err)
	}
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("harness: acker: subscribe %s at %s: %v", dataTopic, url, err)
		}
	case <-time.After(clientTimeout + time.Second):
		t.Fatalf("harness: acker: subscribe %s at %s did not finish", dataTopic, url)
	}
	return a
}

func (a *Acker) handle(c mqtt.Client, ackTopic string, m mqtt.Message) {
	if frame.Is(m.Payload()) {
		a.handleFrame(c, ackTopic, m.Payload())
		return
	}
	in, err := envelope.DecodeIngress(m.Payload())
	a.mu.Lock()
	if err != nil {
		a.bad++
		a.mu.Unlock()
		return
	}
	a.seen = append(a.seen, in)
	a.mu.Unlock()
	var acks [][]byte
	if a.reply != nil {
		acks = a.reply(in)
	} else {
		ack, _ := envelope.EncodeAck(in.EventID)
		acks = [][]byte{ack}
	}
	for _, ack := range acks {
		c.Publish(ackTopic, 1, false, ack).WaitTimeout(clientTimeout)
	}
}

// handleFrame records a frame's events and ACKs the frame.
func (a *Acker) handleFrame(c mqtt.Client, ackTopic string, raw []byte) {
	id, events, err := frame.Decode(raw, frame.DefaultLimits)
	a.mu.Lock()
	if err != nil {
		a.bad++
		a.mu.Unlock()
		return
	}
	for _, e := range events {
		a.seen = append(a.seen, envelope.Ingress{EventID: e.ID, Topic: e.Topic, Payload: e.Payload})
	}
	a.frames++
	a.mu.Unlock()
	ack, _ := envelope.EncodeAck(id)
	c.Publish(ackTopic, 1, false, ack).WaitTimeout(clientTimeout)
}

// Seen returns every envelope received, duplicates included.
func (a *Acker) Seen() []envelope.Ingress {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]envelope.Ingress(nil), a.seen...)
}

// Frames counts the frames received, duplicates included.
func (a *Acker) Frames() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.frames
}

// Malformed counts messages on the data topic that were not valid envelopes.
func (a *Acker) Malformed() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bad
}

// Close disconnects.
func (a *Acker) Close() {
	if a.client.IsConnected() {
		a.client.Disconnect(250)
	}
}
