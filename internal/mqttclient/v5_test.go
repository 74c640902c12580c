package mqttclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/embedded"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
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
	msgs []mqttmsg.Message
	more chan struct{} // capacity 1: something arrived
}

func newInbox() *inbox { return &inbox{more: make(chan struct{}, 1)} }

func (b *inbox) add(_ mqttclient.Conn, m mqttmsg.Message) {
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

func (b *inbox) all() []mqttmsg.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]mqttmsg.Message(nil), b.msgs...)
}

// waitFor waits, bounded, until at least n messages arrived.
func (b *inbox) waitFor(t *testing.T, n int, within time.Duration) []mqttmsg.Message {
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
func (b *inbox) quiet(d time.Duration) []mqttmsg.Message {
	time.Sleep(d)
	return b.all()
}

// startWith starts a client that subscribes to filters on every connection
// and collects its messages in b (both optional); it is closed at cleanup.
func startWith(t *testing.T, cfg mqttclient.Config, filters map[string]byte, b *inbox, opts mqttclient.Options) mqttclient.Transport {
	t.Helper()
	h := mqttclient.Handlers{}
	if b != nil {
		h.OnMessage = b.add
	}
	if filters != nil {
		h.OnConnect = func(ctx context.Context, conn mqttclient.Conn) error { return conn.Subscribe(ctx, filters) }
	}
	c, err := embedded.StartClient(cfg, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeClient(t, c) })
	return c
}

func publish(t *testing.T, conn mqttclient.Conn, p mqttmsg.Publication) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.Publish(ctx, p); err != nil {
		t.Fatalf("publish to %q: %v", p.Topic, err)
	}
}

// brokers are the two v5 brokers every round-trip test runs on.
func brokers() map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"mosquitto": func(t *testing.T) string { return harness.StartMosquitto(t, harness.MosquittoOptions{}).URL() },
		"embedded":  func(t *testing.T) string { return "embedded://?dir=" + filepath.Join(t.TempDir(), "broker") },
	}
}

func TestV5RoundTripCarriesPropertiesAndBinaryPayloads(t *testing.T) {
	for name, start := range brokers() {
		t.Run(name, func(t *testing.T) {
			url := start(t)
			got := newInbox()
			waitReady(t, startWith(t, v5config("v5-sub", url), map[string]byte{"v5/#": 2}, got, mqttclient.Options{}))
			pub := startWith(t, v5config("v5-pub", url), nil, nil, mqttclient.Options{})
			conn := waitReady(t, pub)
			if conn.SessionPresent() {
				t.Fatal("a new session reported session present")
			}
			binary := []byte{0x00, 0xff, 0xfe, 0x80, 0xc3, 0x28, '\n', 0x00}
			props := &mqttmsg.Properties{
				User:            []mqttmsg.UserProperty{{Key: "event_id", Value: "e-1"}, {Key: "k", Value: "one"}, {Key: "k", Value: "two"}},
				ContentType:     "application/octet-stream",
				ResponseTopic:   "v5/reply",
				CorrelationData: []byte{0x01, 0x02, 0xff},
				MessageExpiry:   time.Hour,
			}
			for qos := byte(0); qos <= 2; qos++ {
				publish(t, conn, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "v5/t", Payload: binary, Props: props}, QoS: qos})
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
	c := startWith(t, config(m.URL()), nil, nil, mqttclient.Options{})
	conn := waitReady(t, c)
	err := conn.Publish(context.Background(), mqttmsg.Publication{Event: mqttmsg.Event{Topic: "t", Props: &mqttmsg.Properties{ContentType: "x"}}, QoS: 1})
	if !errors.Is(err, mqttclient.ErrNeedsV5) {
		t.Fatalf("publish with properties on 3.1.1: %v, want ErrNeedsV5", err)
	}
	if conn.Limits() != mqttclient.NoLimits {
		t.Fatalf("3.1.1 limits %+v, want NoLimits", conn.Limits())
	}
}

// TestV5ManualAckConsumerHoldsMoreThanMosquittosInflightDefault: with a
// default-configured mosquitto (max_inflight_messages 20) a 3.1.1
// manual-ack consumer holds 20 unacknowledged messages; an MQTT 5 consumer
// with Receive Maximum 100 holds 60. Acks sent afterwards are not
// redelivered on the next connection.
func TestV5ManualAckConsumerHoldsMoreThanMosquittosInflightDefault(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	const n = 60

	v3 := newInbox()
	v3cfg := config(m.URL())
	v3cfg.ClientID = "v3-held"
	waitReady(t, startWith(t, v3cfg, map[string]byte{"held": 1}, v3, mqttclient.Options{ManualAck: true}))

	got := newInbox()
	cfg := v5config("v5-held", m.URL())
	cfg.ReceiveMaximum = 100
	sub := startWith(t, cfg, map[string]byte{"held": 1}, got, mqttclient.Options{ManualAck: true})
	waitReady(t, sub)

	pub := waitReady(t, startWith(t, v5config("v5-held-pub", m.URL()), nil, nil, mqttclient.Options{}))
	for i := 0; i < n; i++ {
		publish(t, pub, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "held", Payload: []byte{byte(i)}}, QoS: 1})
	}
	msgs := got.waitFor(t, n, 10*time.Second)
	if held := len(v3.waitFor(t, 20, 10*time.Second)); held != 20 {
		t.Fatalf("the 3.1.1 consumer holds %d unacknowledged messages, want mosquitto's default 20", held)
	}
	if extra := v3.quiet(300 * time.Millisecond); len(extra) != 20 {
		t.Fatalf("the 3.1.1 consumer got %d unacknowledged messages, want mosquitto's default 20", len(extra))
	}
	for i, msg := range msgs {
		if msg.Payload()[0] != byte(i) {
			t.Fatalf("message %d has payload %d: out of order", i, msg.Payload()[0])
		}
		msg.Ack()
	}
	closeClient(t, sub)

	again := newInbox()
	conn := waitReady(t, startWith(t, cfg, map[string]byte{"held": 1}, again, mqttclient.Options{ManualAck: true}))
	if !conn.SessionPresent() {
		t.Fatal("the persistent v5 session was not present on reconnect")
	}
	if redelivered := again.quiet(500 * time.Millisecond); len(redelivered) != 0 {
		t.Fatalf("%d acknowledged messages were redelivered", len(redelivered))
	}
}

// Unacknowledged messages come back on the next connection of a
// persistent session; an ack made on a lost connection is not sent on the
// next one (the redelivery must still come).
func TestV5UnackedMessagesAreRedeliveredAndAStaleAckGoesNowhere(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	proxy := harness.NewProxy(t, m.Addr())
	got := newInbox()
	cfg := v5config("v5-redeliver", proxy.URL())
	sub := startWith(t, cfg, map[string]byte{"r": 1}, got, mqttclient.Options{ManualAck: true})
	first := waitReady(t, sub)
	pub := waitReady(t, startWith(t, v5config("v5-redeliver-pub", m.URL()), nil, nil, mqttclient.Options{}))
	publish(t, pub, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "r", Payload: []byte("once")}, QoS: 1})
	stale := got.waitFor(t, 1, 10*time.Second)[0]

	proxy.Cut()
	select {
	case <-first.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the connection was not lost after the cut")
	}
	proxy.Restore()
	second := waitReady(t, sub)
	if !second.SessionPresent() {
		t.Fatal("session not present after reconnect")
	}
	redelivered := got.waitFor(t, 2, 10*time.Second)[1]
	if string(redelivered.Payload()) != "once" || !redelivered.Duplicate() {
		t.Fatalf("redelivery: payload %q dup %v, want \"once\" with DUP", redelivered.Payload(), redelivered.Duplicate())
	}
	stale.Ack() // belongs to the lost connection: must not ack the redelivery
	closeClient(t, sub)

	again := newInbox()
	third := waitReady(t, startWith(t, cfg, map[string]byte{"r": 1}, again, mqttclient.Options{ManualAck: true}))
	if !third.SessionPresent() {
		t.Fatal("session not present on the third connection")
	}
	if msg := again.waitFor(t, 1, 10*time.Second)[0]; string(msg.Payload()) != "once" {
		t.Fatalf("third connection got %q", msg.Payload())
	}
}

// A session with a 1 s expiry interval is gone after 2 s offline: no
// session present, nothing queued comes. The default (SessionExpiryDefault)
// ends a clean session with its connection and keeps a persistent one.
func TestV5SessionExpiresAfterItsInterval(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	cfg := v5config("v5-expiry", m.URL())
	cfg.SessionExpiry = time.Second
	sub := startWith(t, cfg, map[string]byte{"e": 1}, newInbox(), mqttclient.Options{ManualAck: true})
	waitReady(t, sub)
	closeClient(t, sub)
	pub := waitReady(t, startWith(t, v5config("v5-expiry-pub", m.URL()), nil, nil, mqttclient.Options{}))
	publish(t, pub, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "e", Payload: []byte("queued")}, QoS: 1})
	time.Sleep(2 * time.Second)

	got := newInbox()
	c, err := embedded.StartClient(cfg, mqttclient.Handlers{OnMessage: got.add}, mqttclient.Options{ManualAck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer closeClient(t, c)
	if conn := waitReady(t, c); conn.SessionPresent() {
		t.Fatal("the session outlived its 1 s expiry interval")
	}
	if msgs := got.quiet(500 * time.Millisecond); len(msgs) != 0 {
		t.Fatalf("%d messages of the expired session arrived", len(msgs))
	}

	// The default with a clean session: it ends with the connection.
	clean := v5config("v5-clean", m.URL())
	clean.CleanSession = true
	cl := startWith(t, clean, map[string]byte{"e": 1}, nil, mqttclient.Options{})
	waitReady(t, cl)
	closeClient(t, cl)
	clean.CleanSession = false // resume whatever is left
	if conn := waitReady(t, startWith(t, clean, nil, nil, mqttclient.Options{})); conn.SessionPresent() {
		t.Fatal("a clean session with the default expiry outlived its connection")
	}

	// The control: the default without a clean session keeps it.
	keep := v5config("v5-keep", m.URL())
	k := startWith(t, keep, map[string]byte{"e": 1}, nil, mqttclient.Options{})
	waitReady(t, k)
	closeClient(t, k)
	publish(t, pub, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "e", Payload: []byte("kept")}, QoS: 1})
	time.Sleep(2 * time.Second)
	kept := newInbox()
	if conn := waitReady(t, startWith(t, keep, nil, kept, mqttclient.Options{})); !conn.SessionPresent() {
		t.Fatal("a never-expiring session was gone after 2 s")
	}
	if msg := kept.waitFor(t, 1, 10*time.Second)[0]; string(msg.Payload()) != "kept" {
		t.Fatalf("kept session delivered %q", msg.Payload())
	}
}

// aclMosquitto starts mosquitto with an ACL for anonymous clients: open/#
// read and write, read/# read only, nothing else.
func aclMosquitto(t *testing.T) *harness.Mosquitto {
	acl := filepath.Join(t.TempDir(), "acl")
	if err := os.WriteFile(acl, []byte("topic readwrite open/#\ntopic read read/#\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return harness.StartMosquitto(t, harness.MosquittoOptions{Extra: "acl_file " + acl + "\n"})
}

func TestV5PubackReasonCodes(t *testing.T) {
	m := aclMosquitto(t)
	conn := waitReady(t, startWith(t, v5config("v5-puback", m.URL()), nil, nil, mqttclient.Options{}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Nobody subscribes to open/none: mosquitto answers 0x10.
	if err := conn.Publish(ctx, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "open/none", Payload: []byte("x")}, QoS: 1}); err != nil {
		t.Fatalf("0x10 without RequireSubscribers: %v, want success", err)
	}
	// Mosquitto 2.0.11 says 0x10 in the PUBACK of QoS 1 only (its QoS 2
	// PUBREC is always 0x00: subscribers are matched at PUBREL).
	err := conn.Publish(ctx, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "open/none", Payload: []byte("x")}, QoS: 1, RequireSubscribers: true})
	var rc *mqttclient.ReasonCodeError
	if !errors.As(err, &rc) || rc.Code != mqttclient.ReasonNoMatchingSubscribers || rc.Packet != "PUBACK" {
		t.Fatalf("RequireSubscribers and no subscriber: %v, want a PUBACK ReasonCodeError 0x10", err)
	}

	// With a subscriber, RequireSubscribers succeeds.
	waitReady(t, startWith(t, v5config("v5-puback-sub", m.URL()), map[string]byte{"open/some": 1}, newInbox(), mqttclient.Options{}))
	if err := conn.Publish(ctx, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "open/some", Payload: []byte("x")}, QoS: 1, RequireSubscribers: true}); err != nil {
		t.Fatalf("RequireSubscribers with a subscriber: %v", err)
	}

	// The ACL denies writing to read/x: 0x87 Not authorized.
	err = conn.Publish(ctx, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "read/x", Payload: []byte("x")}, QoS: 1})
	if !errors.As(err, &rc) || rc.Code != 0x87 || rc.Packet != "PUBACK" || !strings.Contains(err.Error(), "0x87") {
		t.Fatalf("publish denied by the ACL: %v, want PUBACK reason code 0x87", err)
	}
	if !conn.Alive() {
		t.Fatal("a refused publish lost the connection")
	}
}

// The embedded broker's ACL (mochi) refuses a filter in the SUBACK and a
// publish in the PUBACK (QoS 1) or PUBREC (QoS 2), all with 0x87.
func TestV5EmbeddedACLRefusalsAreReasonCodeErrors(t *testing.T) {
	dir := t.TempDir()
	users := filepath.Join(dir, "users")
	if out, err := exec.Command("mosquitto_passwd", "-b", "-c", users, "plant", "plant-pw").CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_passwd (part of Debian's mosquitto package): %v\n%s", err, out)
	}
	acl := filepath.Join(dir, "acl.yaml")
	if err := os.WriteFile(acl, []byte("plant:\n  write: [ open/# ]\n  read: [ open/#, read/# ]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	owner := startWith(t, v5config("v5-acl-owner", fmt.Sprintf("embedded://?dir=%s&listen=%s&users=%s&acl=%s", filepath.Join(dir, "broker"), addr, users, acl)), nil, nil, mqttclient.Options{})
	waitReady(t, owner)

	cfg := v5config("v5-acl", "tcp://"+addr)
	cfg.User, cfg.Password = "plant", "plant-pw"
	conn := waitReady(t, startWith(t, cfg, nil, nil, mqttclient.Options{}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	err := conn.Subscribe(ctx, map[string]byte{"open/a": 1, "secret/b": 1})
	var rc *mqttclient.ReasonCodeError
	if !errors.As(err, &rc) || rc.Packet != "SUBACK" || rc.Filter != "secret/b" || rc.Code != 0x87 {
		t.Fatalf("subscribe to a denied filter: %v, want a SUBACK ReasonCodeError 0x87 for secret/b", err)
	}
	if !strings.Contains(err.Error(), `"secret/b"`) || !strings.Contains(err.Error(), "0x87") {
		t.Fatalf("error %q does not name the filter and the code", err)
	}
	if err := conn.Subscribe(ctx, map[string]byte{"open/a": 1, "read/b": 1}); err != nil {
		t.Fatalf("allowed filters: %v", err)
	}
	for qos, packet := range map[byte]string{1: "PUBACK", 2: "PUBREC"} {
		err := conn.Publish(ctx, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "read/b", Payload: []byte("x")}, QoS: qos})
		if !errors.As(err, &rc) || rc.Packet != packet || rc.Code != 0x87 {
			t.Fatalf("QoS %d publish denied by the ACL: %v, want a %s ReasonCodeError 0x87", qos, err, packet)
		}
	}
	publish(t, conn, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "open/a", Payload: []byte("x")}, QoS: 2})
}

func TestV5SharedSubscriptionSplitsMessages(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	a, b := newInbox(), newInbox()
	waitReady(t, startWith(t, v5config("v5-share-a", m.URL()), map[string]byte{"$share/g/s/#": 1}, a, mqttclient.Options{}))
	waitReady(t, startWith(t, v5config("v5-share-b", m.URL()), map[string]byte{"$share/g/s/#": 1}, b, mqttclient.Options{}))
	pub := waitReady(t, startWith(t, v5config("v5-share-pub", m.URL()), nil, nil, mqttclient.Options{}))
	const n = 40
	for i := 0; i < n; i++ {
		publish(t, pub, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "s/x", Payload: []byte{byte(i)}}, QoS: 1})
	}
	deadline := time.After(10 * time.Second)
	for a.len()+b.len() < n {
		select {
		case <-a.more:
		case <-b.more:
		case <-deadline:
			t.Fatalf("received %d + %d of %d", a.len(), b.len(), n)
		}
	}
	time.Sleep(200 * time.Millisecond)
	seen := map[byte]int{}
	for _, msg := range append(a.all(), b.all()...) {
		seen[msg.Payload()[0]]++
	}
	if len(seen) != n || a.len()+b.len() != n {
		t.Fatalf("%d distinct of %d deliveries, want each of %d once", len(seen), a.len()+b.len(), n)
	}
	if a.len() == 0 || b.len() == 0 {
		t.Fatalf("the group did not split: %d and %d", a.len(), b.len())
	}
}

// The server's CONNACK limits refuse a publication before it is sent.
func TestV5ServerLimitsRefuseBeforeSending(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{Extra: "max_packet_size 1000\nretain_available false\nmax_qos 1"})
	got := newInbox()
	waitReady(t, startWith(t, v5config("v5-limits-sub", m.URL()), map[string]byte{"l/#": 1}, got, mqttclient.Options{}))
	conn := waitReady(t, startWith(t, v5config("v5-limits", m.URL()), nil, nil, mqttclient.Options{}))
	want := mqttclient.ServerLimits{ReceiveMaximum: 20, MaximumPacketSize: 1000, MaximumQoS: 1, RetainAvailable: false}
	if conn.Limits() != want {
		t.Fatalf("limits %+v, want %+v", conn.Limits(), want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, p := range map[string]mqttmsg.Publication{
		"QoS above Maximum QoS":     {Event: mqttmsg.Event{Topic: "l/q", Payload: []byte("x")}, QoS: 2},
		"retained":                  {Event: mqttmsg.Event{Topic: "l/r", Retained: true, Payload: []byte("x")}, QoS: 1},
		"above Maximum Packet Size": {Event: mqttmsg.Event{Topic: "l/s", Payload: make([]byte, 1000)}, QoS: 1},
	} {
		if err := conn.Publish(ctx, p); !errors.Is(err, mqttclient.ErrExceedsServerLimits) {
			t.Errorf("%s: %v, want ErrExceedsServerLimits", name, err)
		}
	}
	// Mosquitto disconnects a client that sends any of these: the
	// connection staying up shows nothing was sent.
	if !conn.Alive() {
		t.Fatal("the connection was lost: a refused publication reached the broker")
	}
	publish(t, conn, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "l/ok", Payload: make([]byte, 900)}, QoS: 1})
	if msg := got.waitFor(t, 1, 10*time.Second)[0]; msg.Topic() != "l/ok" {
		t.Fatalf("got %q: a refused publication was delivered", msg.Topic())
	}
}

// PublishAsync never blocks on the server's Receive Maximum (mosquitto: 20):
// 200 publications (QoS 1 and 2) queue at once and all complete, in order
// per QoS (the broker forwards a QoS 2 message at its PUBREL, so the two
// levels interleave).
func TestV5PublishAsyncQueuesBeyondTheServersReceiveMaximum(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	got := newInbox()
	waitReady(t, startWith(t, v5config("v5-window-sub", m.URL()), map[string]byte{"w": 2}, got, mqttclient.Options{}))
	conn := waitReady(t, startWith(t, v5config("v5-window", m.URL()), nil, nil, mqttclient.Options{}))
	if rm := conn.Limits().ReceiveMaximum; rm != 20 {
		t.Fatalf("mosquitto's Receive Maximum is %d, want its default 20", rm)
	}
	const n = 200
	toks := make([]mqttclient.Token, n)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		for i := range toks {
			toks[i] = conn.PublishAsync(mqttmsg.Publication{Event: mqttmsg.Event{Topic: "w", Payload: []byte{byte(i)}}, QoS: byte(1 + i%2)})
		}
	}()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("PublishAsync blocked")
	}
	for i, tok := range toks {
		select {
		case <-tok.Done():
			if err := tok.Error(); err != nil {
				t.Fatalf("publication %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("publication %d did not complete", i)
		}
	}
	last := map[byte]int{1: -1, 2: -1}
	for _, msg := range got.waitFor(t, n, 10*time.Second) {
		i := int(msg.Payload()[0])
		if i <= last[msg.Qos()] {
			t.Fatalf("QoS %d message %d arrived after %d: out of order", msg.Qos(), i, last[msg.Qos()])
		}
		last[msg.Qos()] = i
	}
}

// Publications waiting for a PUBACK, and queued behind a full Receive
// Maximum, fail when the connection is lost; the next connection works.
func TestV5TokensFailWhenTheConnectionIsLost(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	proxy := harness.NewProxy(t, m.Addr())
	c := startWith(t, v5config("v5-lost", proxy.URL()), nil, nil, mqttclient.Options{})
	conn := waitReady(t, c)
	proxy.Stall()
	toks := make([]mqttclient.Token, 30) // 20 in flight, 10 queued
	for i := range toks {
		toks[i] = conn.PublishAsync(mqttmsg.Publication{Event: mqttmsg.Event{Topic: "lost", Payload: []byte("x")}, QoS: 1})
	}
	select {
	case <-toks[0].Done():
		t.Fatalf("a publication completed through a stalled connection: %v", toks[0].Error())
	case <-time.After(300 * time.Millisecond):
	}
	proxy.Cut()
	for i, tok := range toks {
		select {
		case <-tok.Done():
			if err := tok.Error(); !errors.Is(err, mqttclient.ErrNotConnected) {
				t.Fatalf("publication %d after the connection was lost: %v, want ErrNotConnected", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("publication %d still pending 10 s after the connection was lost", i)
		}
	}
	if tok := conn.PublishAsync(mqttmsg.Publication{Event: mqttmsg.Event{Topic: "lost"}, QoS: 1}); !errors.Is(tok.Error(), mqttclient.ErrNotConnected) {
		t.Fatalf("publish on a lost Conn: %v, want ErrNotConnected", tok.Error())
	}
	proxy.Restore()
	publish(t, waitReady(t, c), mqttmsg.Publication{Event: mqttmsg.Event{Topic: "lost", Payload: []byte("after")}, QoS: 1})
}

// The broker's DISCONNECT (here: session taken over, 0x8E, which the
// embedded broker sends and mosquitto 2.0.11 does not: it closes the
// socket) loses the Conn and is logged at warn with its code and reason.
func TestV5ServerDisconnectLosesTheConnAndIsLogged(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "broker")
	logs := &harness.LogBuffer{}
	log := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	first := waitReady(t, startWith(t, v5config("v5-twin", "embedded://?dir="+dir), nil, nil, mqttclient.Options{Logger: log}))
	c, err := embedded.StartClient(v5config("v5-twin", "embedded://?dir="+dir), mqttclient.Handlers{}, mqttclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, c)
	select {
	case <-first.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the taken-over connection was not marked lost")
	}
	closeClient(t, c)
	deadline := time.Now().Add(10 * time.Second)
	for !logs.Contains("level=WARN msg=\"MQTT server sent DISCONNECT with reason code 0x8e: ") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning naming the DISCONNECT's code 0x8e; logged:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The will of a v5 connection that dies without DISCONNECT is published.
func TestV5WillIsPublishedWhenTheConnectionDies(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	proxy := harness.NewProxy(t, m.Addr())
	got := newInbox()
	waitReady(t, startWith(t, v5config("v5-will-sub", m.URL()), map[string]byte{"will/#": 1}, got, mqttclient.Options{}))
	cfg := v5config("v5-will", proxy.URL())
	cfg.Will = &mqttclient.Will{Topic: "will/v5", Payload: []byte("gone"), QoS: 1}
	waitReady(t, startWith(t, cfg, nil, nil, mqttclient.Options{}))
	if msgs := got.quiet(200 * time.Millisecond); len(msgs) != 0 {
		t.Fatalf("the will was published while connected: %q", msgs[0].Payload())
	}
	proxy.Cut()
	if msg := got.waitFor(t, 1, 10*time.Second)[0]; msg.Topic() != "will/v5" || string(msg.Payload()) != "gone" {
		t.Fatalf("got %q on %q, want the will", msg.Payload(), msg.Topic())
	}
}

// Inbound QoS 2: the PUBREC leaves at Message.Ack, and the broker's PUBREL
// that follows reaches OnPubrel with the message's packet ID.
func TestV5OnPubrelFollowsTheAckOfAQoS2Message(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	got := newInbox()
	rels := make(chan uint16, 10)
	c, err := embedded.StartClient(v5config("v5-qos2", m.URL()), mqttclient.Handlers{
		OnConnect: func(ctx context.Context, conn mqttclient.Conn) error {
			return conn.Subscribe(ctx, map[string]byte{"q2": 2})
		},
		OnMessage: got.add,
		OnPubrel:  func(_ mqttclient.Conn, id uint16) { rels <- id },
	}, mqttclient.Options{ManualAck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer closeClient(t, c)
	waitReady(t, c)
	pub := waitReady(t, startWith(t, v5config("v5-qos2-pub", m.URL()), nil, nil, mqttclient.Options{}))
	publish(t, pub, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "q2", Payload: []byte("once")}, QoS: 2})
	msg := got.waitFor(t, 1, 10*time.Second)[0]
	if msg.Qos() != 2 {
		t.Fatalf("QoS %d, want 2", msg.Qos())
	}
	select {
	case id := <-rels:
		t.Fatalf("PUBREL %d before the message was acknowledged", id)
	case <-time.After(300 * time.Millisecond):
	}
	msg.Ack()
	select {
	case id := <-rels:
		if id != msg.MessageID() {
			t.Fatalf("PUBREL for %d, want the message's packet ID %d", id, msg.MessageID())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no PUBREL after the PUBREC")
	}
}

// BenchmarkPublishQoS1 publishes 100-byte QoS 1 messages to mosquitto with
// at most 1000 unconfirmed, on each protocol:
//
//	go test -run '^$' -bench PublishQoS1 -benchtime 20000x ./internal/mqttclient/
func BenchmarkPublishQoS1(b *testing.B) {
	for _, proto := range []string{mqttclient.V311, mqttclient.V5} {
		b.Run("mqtt"+proto, func(b *testing.B) {
			m := harness.StartMosquitto(b, harness.MosquittoOptions{})
			cfg := config(m.URL())
			cfg.ProtocolVersion = proto
			c, err := embedded.StartClient(cfg, mqttclient.Handlers{}, mqttclient.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = c.Close(context.Background()) }()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			conn, err := c.WaitReady(ctx)
			if err != nil {
				b.Fatal(err)
			}
			payload := make([]byte, 100)
			const unconfirmed = 1000
			var window []mqttclient.Token
			wait := func(tok mqttclient.Token) {
				select {
				case <-tok.Done():
					if err := tok.Error(); err != nil {
						b.Fatal(err)
					}
				case <-time.After(20 * time.Second):
					b.Fatal("no PUBACK within 20 s")
				}
			}
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			for range b.N {
				if len(window) == unconfirmed {
					wait(window[0])
					window = window[1:]
				}
				window = append(window, conn.PublishAsync(mqttmsg.Publication{Event: mqttmsg.Event{Topic: "bench", Payload: payload}, QoS: 1}))
			}
			for _, tok := range window {
				wait(tok)
			}
		})
	}
}

// The server's keepalive from CONNACK replaces the client's: mosquitto with
// max_keepalive 10 tells a client asking for 5 minutes to use 10 s, so a
// broker that stops answering is noticed within two 10 s intervals rather
// than after minutes.
func TestV5ServerKeepaliveIsHonoured(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{Extra: "max_keepalive 10\n"})
	proxy := harness.NewProxy(t, m.Addr())
	cfg := v5config("v5-keepalive", proxy.URL())
	cfg.KeepAlive = 5 * time.Minute
	conn := waitReady(t, startWith(t, cfg, nil, nil, mqttclient.Options{}))
	proxy.Stall()
	select {
	case <-conn.Lost():
	case <-time.After(45 * time.Second):
		t.Fatal("a stalled connection was not lost within 45 s: the server keepalive of 10 s was not used")
	}
}
