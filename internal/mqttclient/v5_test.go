package mqttclient_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// v5config is config with protocol version 5 and a persistent session.
func v5config(id string, urls ...string) mqttclient.Config {
	c := config(urls...)
	c.ClientID = id
	c.ProtocolVersion = mqttclient.V5
	c.SessionExpiry = mqttclient.SessionExpiryDefault
	return c
}

// inbox collects the messages of a client, safe for the handler goroutine.
type inbox struct {
	mu   sync.Mutex
	msgs []mqttclient.Message
	more chan struct{} // capacity 1: something arrived
}

func newInbox() *inbox { return &inbox{more: make(chan struct{}, 1)} }

func (b *inbox) add(_ mqttclient.Conn, m mqttclient.Message) {
	b.mu.Lock()
	b.msgs = append(b.msgs, m)
	b.mu.Unlock()
	select {
	case b.more <- struct{}{}:
	default:
	}
}

func (b *inbox) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.msgs)
}

func (b *inbox) all() []mqttclient.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]mqttclient.Message(nil), b.msgs...)
}

// waitFor waits, bounded, until at least n messages arrived.
func (b *inbox) waitFor(t *testing.T, n int, within time.Duration) []mqttclient.Message {
	t.Helper()
	deadline := time.After(within)
	for b.len() < n {
		select {
		case <-b.more:
		case <-deadline:
			t.Fatalf("received %d messages within %s, want %d", b.len(), within, n)
		}
	}
	return b.all()
}

// quiet waits d and returns what arrived meanwhile (for "nothing more came").
func (b *inbox) quiet(d time.Duration) []mqttclient.Message {
	time.Sleep(d)
	return b.all()
}

// startV5 starts a v5 client that subscribes to filters on every connection.
func startV5(t *testing.T, cfg mqttclient.Config, filters map[string]byte, b *inbox, opts mqttclient.Options) mqttclient.Transport {
	t.Helper()
	h := mqttclient.Handlers{}
	if b != nil {
		h.OnMessage = b.add
	}
	if filters != nil {
		h.OnConnect = func(ctx context.Context, conn mqttclient.Conn) error { return conn.Subscribe(ctx, filters) }
	}
	c, err := mqttclient.Start(cfg, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeClient(t, c) })
	return c
}

func publish(t *testing.T, conn mqttclient.Conn, p mqttclient.Publication) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.Publish(ctx, p); err != nil {
		t.Fatalf("publish to %q: %v", p.Topic, err)
	}
}

// brokers are the two v5 brokers every round-trip test runs on.
func brokers(t *testing.T) map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"mosquitto": func(t *testing.T) string { return harness.StartMosquitto(t, harness.MosquittoOptions{}).URL() },
		"embedded":  func(t *testing.T) string { return "embedded://?dir=" + filepath.Join(t.TempDir(), "broker") },
	}
}

func TestV5RoundTripCarriesPropertiesAndBinaryPayloads(t *testing.T) {
	for name, start := range brokers(t) {
		t.Run(name, func(t *testing.T) {
			url := start(t)
			got := newInbox()
			waitReady(t, startV5(t, v5config("v5-sub", url), map[string]byte{"v5/#": 2}, got, mqttclient.Options{}))
			pub := startV5(t, v5config("v5-pub", url), nil, nil, mqttclient.Options{})
			conn := waitReady(t, pub)
			if conn.SessionPresent() {
				t.Fatal("a new session reported session present")
			}
			binary := []byte{0x00, 0xff, 0xfe, 0x80, 0xc3, 0x28, '\n', 0x00}
			props := &mqttclient.Properties{
				User:            []mqttclient.UserProperty{{Key: "event_id", Value: "e-1"}, {Key: "k", Value: "one"}, {Key: "k", Value: "two"}},
				ContentType:     "application/octet-stream",
				ResponseTopic:   "v5/reply",
				CorrelationData: []byte{0x01, 0x02, 0xff},
				MessageExpiry:   time.Hour,
			}
			for qos := byte(0); qos <= 2; qos++ {
				publish(t, conn, mqttclient.Publication{Topic: "v5/t", QoS: qos, Payload: binary, Props: props})
			}
			msgs := got.waitFor(t, 3, 10*time.Second)
			for i, m := range msgs {
				if m.Qos() != byte(i) {
					t.Errorf("message %d: QoS %d, want %d", i, m.Qos(), i)
				}
				if m.Topic() != "v5/t" || !bytes.Equal(m.Payload(), binary) {
					t.Errorf("message %d: topic %q payload %x, want v5/t %x", i, m.Topic(), m.Payload(), binary)
				}
				p := m.Properties()
				if p == nil {
					t.Fatalf("message %d has no properties on a v5 connection", i)
				}
				if len(p.User) != 3 || p.User[0] != props.User[0] || p.User[1] != props.User[1] || p.User[2] != props.User[2] {
					t.Errorf("message %d: user properties %v, want %v in order", i, p.User, props.User)
				}
				if p.ContentType != props.ContentType || p.ResponseTopic != props.ResponseTopic || !bytes.Equal(p.CorrelationData, props.CorrelationData) {
					t.Errorf("message %d: properties %+v, want %+v", i, p, props)
				}
				// The broker sends the remaining lifetime: at most an hour,
				// and not less than what a slow test could have used up.
				if p.MessageExpiry <= 50*time.Minute || p.MessageExpiry > time.Hour {
					t.Errorf("message %d: message expiry %s, want just under 1h", i, p.MessageExpiry)
				}
			}
		})
	}
}

func TestV5PropertiesOnA311ConnAreRefused(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	c := startV5(t, config(m.URL()), nil, nil, mqttclient.Options{})
	conn := waitReady(t, c)
	err := conn.Publish(context.Background(), mqttclient.Publication{Topic: "t", QoS: 1, Props: &mqttclient.Properties{ContentType: "x"}})
	if !errors.Is(err, mqttclient.ErrNeedsV5) {
		t.Fatalf("publish with properties on 3.1.1: %v, want ErrNeedsV5", err)
	}
	if conn.Limits() != mqttclient.NoLimits {
		t.Fatalf("3.1.1 limits %+v, want NoLimits", conn.Limits())
	}
}
