package harness

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
)

// clientTimeout bounds every connect, subscribe and disconnect of the test
// clients.
const clientTimeout = 10 * time.Second

// Received is one PUBLISH as a test client saw it.
type Received struct {
	Topic     string
	Payload   []byte
	QoS       byte
	Duplicate bool
	Retained  bool
	MessageID uint16
}

// Subscriber is a paho client that subscribes at QoS 1 and records every
// message it receives, duplicates included. Paho acknowledges each message
// after recording it. It reconnects on its own (at most 1 s apart) and
// subscribes again on every connect.
type Subscriber struct {
	t        testing.TB
	clientID string
	client   mqtt.Client

	mu       sync.Mutex
	msgs     []Received
	connects int
	subErr   error
}

// Subscribe connects a QoS 1 subscriber with clientID and clean session
// clean to url and subscribes to filters. It fails the test if the connect
// or the first SUBACK takes longer than 10 s. The subscriber disconnects at
// cleanup.
//
// The message handler is installed before Connect because a resumed
// session (clean false) delivers queued messages right after CONNACK, before
// any SUBSCRIBE; without a handler paho would drop them unacknowledged.
func Subscribe(t testing.TB, url, clientID string, clean bool, filters ...string) *Subscriber {
	t.Helper()
	if len(filters) == 0 {
		t.Fatal("harness: Subscribe needs at least one topic filter")
	}
	s := &Subscriber{t: t, clientID: clientID}
	subscribed := make(chan error, 1)
	subs := make(map[string]byte, len(filters))
	for _, f := range filters {
		subs[f] = 1
	}
	opts := mqtt.NewClientOptions().
		AddBroker(url).
		SetClientID(clientID).
		SetCleanSession(clean).
		SetOrderMatters(true). // record in arrival order; the handler never blocks
		SetAutoReconnect(true).
		SetMaxReconnectInterval(time.Second).
		SetConnectTimeout(5 * time.Second).
		SetKeepAlive(30 * time.Second).
		SetDefaultPublishHandler(s.record).
		SetOnConnectHandler(func(c mqtt.Client) {
			// paho runs this in its own goroutine, so waiting here is safe.
			s.mu.Lock()
			s.connects++
			s.mu.Unlock()
			err := subackErr(c.SubscribeMultiple(subs, nil))
			if err != nil {
				s.mu.Lock()
				s.subErr = err
				s.mu.Unlock()
			}
			select {
			case subscribed <- err:
			default:
			}
		})
	s.client = mqtt.NewClient(opts)
	t.Cleanup(s.Close)
	tok := s.client.Connect()
	if !tok.WaitTimeout(clientTimeout) {
		t.Fatalf("harness: subscriber %s: no CONNACK from %s within %s", clientID, url, clientTimeout)
	}
	if err := tok.Error(); err != nil {
		t.Fatalf("harness: subscriber %s: connect to %s: %v", clientID, url, err)
	}
	select {
	case err := <-subscribed:
		if err != nil {
			t.Fatalf("harness: subscriber %s: subscribe %v at %s: %v", clientID, filters, url, err)
		}
	case <-time.After(clientTimeout + time.Second):
		t.Fatalf("harness: subscriber %s: subscribe %v at %s did not finish", clientID, filters, url)
	}
	return s
}

func (s *Subscriber) record(_ mqtt.Client, m mqtt.Message) {
	r := Received{
		Topic:     m.Topic(),
		Payload:   append([]byte(nil), m.Payload()...),
		QoS:       m.Qos(),
		Duplicate: m.Duplicate(),
		Retained:  m.Retained(),
		MessageID: m.MessageID(),
	}
	s.mu.Lock()
	s.msgs = append(s.msgs, r)
	s.mu.Unlock()
}

// Messages returns a copy of everything received so far, in arrival order.
func (s *Subscriber) Messages() []Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Received(nil), s.msgs...)
}

// Count is the number of messages received so far, duplicates included.
func (s *Subscriber) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs)
}

// Frames is how many of the messages received so far are frames
// (internal/frame): a packing publisher's PUBLISHes.
func (s *Subscriber) Frames() int {
	n := 0
	for _, m := range s.Messages() {
		if frame.Is(m.Payload) {
			n++
		}
	}
	return n
}

// WaitCount reports whether at least n messages arrived within timeout.
func (s *Subscriber) WaitCount(n int, timeout time.Duration) bool {
	return Poll(timeout, func() bool { return s.Count() >= n })
}

// Connected reports whether the client is connected right now.
func (s *Subscriber) Connected() bool { return s.client.IsConnectionOpen() }

// Connects counts successful connects, the first one included; it grows
// by one with every automatic reconnect.
func (s *Subscriber) Connects() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connects
}

// SubscribeErr is the last failed re-subscribe after a reconnect, if any.
func (s *Subscriber) SubscribeErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subErr
}

// Close disconnects (waiting up to 250 ms for in-flight work). A persistent
// session (clean false) stays on the broker and queues messages for the
// next Subscribe with the same client ID. Closing twice is harmless.
func (s *Subscriber) Close() {
	if s.client.IsConnected() {
		s.client.Disconnect(250)
	}
}

// Publish connects a fresh clean-session client to url, publishes every
// payload to topic at QoS 1 and waits for every PUBACK, then disconnects.
// It fails the test on any error or if the PUBACKs take longer than 10 s
// plus 1 s per 1000 messages. Call it from the test's goroutine; elsewhere
// use PublishErr.
func Publish(t testing.TB, url, topic string, payloads [][]byte) {
	t.Helper()
	if err := PublishErr(url, topic, payloads); err != nil {
		t.Fatal(err)
	}
}

// PublishErr is Publish for any goroutine: it returns the error instead of
// failing the test.
func PublishErr(url, topic string, payloads [][]byte) error {
	id := "harness-pub-" + randomHex(6)
	opts := mqtt.NewClientOptions().
		AddBroker(url).
		SetClientID(id).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectTimeout(5 * time.Second)
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(clientTimeout) {
		return fmt.Errorf("harness: publisher: no CONNACK from %s within %s", url, clientTimeout)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("harness: publisher: connect to %s: %v", url, err)
	}
	defer c.Disconnect(250)

	tokens := make([]mqtt.Token, len(payloads))
	for i, p := range payloads {
		tokens[i] = c.Publish(topic, 1, false, p)
	}
	deadline := time.Now().Add(clientTimeout + time.Duration(len(payloads))*time.Millisecond)
	for i, tok := range tokens {
		if !waitToken(tok, deadline) {
			return fmt.Errorf("harness: publisher: message %d of %d to %s at %s: no PUBACK in time", i+1, len(payloads), topic, url)
		}
		if err := tok.Error(); err != nil {
			return fmt.Errorf("harness: publisher: message %d of %d to %s at %s: %v", i+1, len(payloads), topic, url, err)
		}
	}
	return nil
}

// subackErr waits up to clientTimeout for a SUBSCRIBE's token and returns
// its error, or an error saying the SUBACK did not come.
func subackErr(tok mqtt.Token) error {
	if !tok.WaitTimeout(clientTimeout) {
		return fmt.Errorf("no SUBACK within %s", clientTimeout)
	}
	return tok.Error()
}

// waitToken reports whether tok completed before deadline.
func waitToken(tok mqtt.Token, deadline time.Time) bool {
	select {
	case <-tok.Done():
		return true
	default:
	}
	left := time.Until(deadline)
	return left > 0 && tok.WaitTimeout(left)
}

// Payloads turns strings into payloads for Publish.
func Payloads(s ...string) [][]byte {
	out := make([][]byte, len(s))
	for i, v := range s {
		out[i] = []byte(v)
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
