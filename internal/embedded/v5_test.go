package embedded

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// v5Props are the MQTT 5 properties every message of these tests carries.
func v5Props(i int) *paho.PublishProperties {
	expiry := uint32(3600)
	return &paho.PublishProperties{
		User:            paho.UserProperties{{Key: "event_id", Value: fmt.Sprintf("e-%03d", i)}, {Key: "k", Value: "1"}, {Key: "k", Value: "2"}},
		ContentType:     "application/octet-stream",
		ResponseTopic:   "v5/reply",
		CorrelationData: []byte{0xff, byte(i)},
		MessageExpiry:   &expiry,
	}
}

// checkV5Props fails unless p carries v5Props(i) (expiry: what is left of
// the hour).
func checkV5Props(t *testing.T, what string, i int, p *paho.PublishProperties) {
	t.Helper()
	want := v5Props(i)
	if p == nil {
		t.Fatalf("%s: no properties", what)
	}
	if fmt.Sprint(p.User) != fmt.Sprint(want.User) || p.ContentType != want.ContentType ||
		p.ResponseTopic != want.ResponseTopic || !bytes.Equal(p.CorrelationData, want.CorrelationData) {
		t.Fatalf("%s: properties %v %q %q %x, want %v %q %q %x", what,
			p.User, p.ContentType, p.ResponseTopic, p.CorrelationData,
			want.User, want.ContentType, want.ResponseTopic, want.CorrelationData)
	}
	if p.MessageExpiry == nil || *p.MessageExpiry == 0 || *p.MessageExpiry > 3600 {
		t.Fatalf("%s: message expiry %v, want at most 3600 s and not 0", what, p.MessageExpiry)
	}
}

// v5Received is one message a v5Client got.
type v5Received struct {
	topic    string
	payload  []byte
	retained bool
	props    *paho.PublishProperties
}

// v5Client connects an MQTT 5 client (paho.golang) with a session that
// never expires unless clean; received messages go to got. It returns the
// CONNACK's session-present flag.
func v5Client(t *testing.T, broker, id string, clean bool, got chan<- v5Received) (*paho.Client, bool) {
	t.Helper()
	expiry := uint32(0xFFFFFFFF)
	if clean {
		expiry = 0
	}
	return v5Session(t, broker, id, clean, expiry, got)
}

// v5Session is v5Client with the session expiry interval given.
func v5Session(t *testing.T, broker, id string, clean bool, expiry uint32, got chan<- v5Received) (*paho.Client, bool) {
	t.Helper()
	u, err := url.Parse(broker)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.DialTimeout("tcp", u.Host, waitFor)
	if err != nil {
		t.Fatalf("%s: dial %s: %v", id, broker, err)
	}
	cfg := paho.ClientConfig{ClientID: id, Conn: nc}
	if got != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			got <- v5Received{topic: r.Packet.Topic, payload: r.Packet.Payload, retained: r.Packet.Retain, props: r.Packet.Properties}
			return true, nil
		}}
	}
	c := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: clean, KeepAlive: 30,
		// RequestProblemInfo as mqttclient sends it: mochi v2.7.9 leaves user
		// properties out of every packet, PUBLISH included, without it.
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry, RequestProblemInfo: true}})
	if err != nil {
		t.Fatalf("%s: connect: %v", id, err)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	return c, ca.SessionPresent
}

func v5Subscribe(t *testing.T, c *paho.Client, filter string, qos byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}}}); err != nil {
		t.Fatalf("subscribe %s: %v", filter, err)
	}
}

func v5Publish(t *testing.T, c *paho.Client, topic string, qos byte, retain bool, i int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: qos, Retain: retain, Payload: []byte{0x00, 0xff, byte(i)}, Properties: v5Props(i)}); err != nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
}

// receiveV5 waits for n messages and checks each carries its properties.
func receiveV5(t *testing.T, got <-chan v5Received, topic string, n int, retained bool) {
	t.Helper()
	for i := range n {
		select {
		case m := <-got:
			what := fmt.Sprintf("message %d on %s", i, m.topic)
			if m.topic != topic || !bytes.Equal(m.payload, []byte{0x00, 0xff, byte(i)}) || m.retained != retained {
				t.Fatalf("%s: payload %x retained %v, want %s %x retained %v", what, m.payload, m.retained, topic, []byte{0x00, 0xff, byte(i)}, retained)
			}
			checkV5Props(t, what, i, m.props)
		case <-time.After(waitFor):
			t.Fatalf("received %d of %d messages on %s", i, n, topic)
		}
	}
}

// An MQTT 5 session's queued messages and a retained message keep their
// properties (user properties in order, content type, response topic,
// correlation data, message expiry) across a graceful restart and a
// SIGKILL of the embedded broker.
func TestV5PropertiesSurviveARestart(t *testing.T) {
	const n = 20
	for _, kill := range []bool{false, true} {
		name := "graceful"
		if kill {
			name = "sigkill"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			addr := freeAddr(t)
			u := "embedded://?dir=" + url.QueryEscape(dir) + "&listen=" + addr
			broker := "tcp://" + addr
			var restart func()
			if kill {
				child := startHelper(t, u)
				restart = func() {
					if err := child.Process.Signal(syscall.SIGKILL); err != nil {
						t.Fatal(err)
					}
					_ = child.Wait()
					startHelper(t, u)
				}
			} else {
				b, err := Acquire(u)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = b.Release() })
				restart = func() { b = restartBroker(t, b, u) }
			}

			sub, _ := v5Client(t, broker, "v5-persistent", false, nil)
			v5Subscribe(t, sub, "v5/q", 1)
			_ = sub.Disconnect(&paho.Disconnect{})
			pub, _ := v5Client(t, broker, "v5-pub", true, nil)
			for i := range n {
				v5Publish(t, pub, "v5/q", byte(1+i%2), false, i) // waits for the PUBACK/PUBCOMP
			}
			v5Publish(t, pub, "v5/state", 1, true, 0)
			_ = pub.Disconnect(&paho.Disconnect{})

			restart()

			got := make(chan v5Received, n)
			_, present := v5Client(t, broker, "v5-persistent", false, got)
			if !present {
				t.Fatal("session present = false after the restart")
			}
			receiveV5(t, got, "v5/q", n, false)

			ret := make(chan v5Received, 1)
			late, _ := v5Client(t, broker, "v5-late", true, ret)
			v5Subscribe(t, late, "v5/state", 1)
			receiveV5(t, ret, "v5/state", 1, true)
		})
	}
}

// The embedded broker does not hold an MQTT 5 client to its Receive
// Maximum (receiveMaxHook says why): a client that asked for at most 5
// unacknowledged messages and acknowledges none gets all 50 queued for it.
func TestV5ReceiveMaximumIsNotApplied(t *testing.T) {
	const n, receiveMax = 50, 5
	addr := freeAddr(t)
	b, err := Acquire("embedded://?dir=" + url.QueryEscape(t.TempDir()) + "&listen=" + addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Release() })

	nc, err := net.DialTimeout("tcp", addr, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, n)
	c := paho.NewClient(paho.ClientConfig{ClientID: "v5-slow", Conn: nc, EnableManualAcknowledgment: true,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(paho.PublishReceived) (bool, error) {
			got <- struct{}{} // never acknowledged
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	rm := uint16(receiveMax)
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: "v5-slow", CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{ReceiveMaximum: &rm, RequestProblemInfo: true}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	v5Subscribe(t, c, "v5/many", 1)

	pub, _ := v5Client(t, "tcp://"+addr, "v5-many-pub", true, nil)
	for i := range n {
		v5Publish(t, pub, "v5/many", 1, false, i)
	}
	for i := range n {
		select {
		case <-got:
		case <-time.After(waitFor):
			t.Fatalf("received %d of %d unacknowledged messages (Receive Maximum %d)", i, n, receiveMax)
		}
	}
}
