package mqttin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// readTimeout bounds every Read a test expects to succeed.
const readTimeout = 10 * time.Second

// startBroker starts a persistent mosquitto with room for the manual-ack
// tests (mosquitto's default in-flight window is 20).
func startBroker(t *testing.T) *harness.Mosquitto {
	t.Helper()
	return harness.StartMosquitto(t, harness.MosquittoOptions{Persistence: true, MaxInflight: 100})
}

// inputYAML renders a reliable_mqtt_in config; extra holds more fields,
// one per line.
func inputYAML(url, clientID string, topics []string, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "urls: [ %q ]\nclient_id: %s\ntopics:\n", url, clientID)
	for _, tp := range topics {
		fmt.Fprintf(&b, "  - %q\n", tp)
	}
	b.WriteString("connect_timeout: 3s\nreconnect_backoff:\n  initial_interval: 50ms\n  max_interval: 500ms\n")
	for _, e := range extra {
		b.WriteString(e + "\n")
	}
	return b.String()
}

// testInput is a reliable_mqtt_in driven directly by the test: it plays
// Benthos, reading messages and calling their AckFuncs.
type testInput struct {
	t    *testing.T
	in   *input
	logs *harness.LogBuffer
	once sync.Once
}

// openInput builds and connects an input. It is closed at cleanup.
func openInput(t *testing.T, yaml string) *testInput {
	t.Helper()
	ti, err := startInput(t, yaml)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return ti
}

// startInput builds an input and calls Connect once, returning its error:
// the client keeps trying in the background either way.
func startInput(t *testing.T, yaml string) (*testInput, error) {
	return startInputWait(t, yaml, readTimeout)
}

// startInputWait is startInput with Connect bounded by wait.
func startInputWait(t *testing.T, yaml string, wait time.Duration) (*testInput, error) {
	t.Helper()
	conf, err := inputSpec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	logs := &harness.LogBuffer{}
	logger := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	in, err := newInput(conf, service.MockResources(service.MockResourcesOptUseLogger(logger)))
	if err != nil {
		t.Fatalf("newInput: %v", err)
	}
	ti := &testInput{t: t, in: in, logs: logs}
	t.Cleanup(func() {
		ti.close()
		if t.Failed() {
			t.Logf("input log:\n%s", logs.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return ti, in.Connect(ctx)
}

// close closes the input gracefully (bounded by the input's own timeout).
func (ti *testInput) close() {
	ti.once.Do(func() {
		if err := ti.in.Close(context.Background()); err != nil {
			ti.t.Logf("close: %v", err)
		}
	})
}

// closeOnBroker closes the input and waits until mosquitto has seen every
// connection of clientID end. Mosquitto handles a new CONNECT with the same
// client ID before unread bytes of the old connection, dropping PUBACKs
// still in its socket buffer, so a test that reconnects at once would see
// duplicates that a real restart does not produce.
func (ti *testInput) closeOnBroker(b *harness.Mosquitto, clientID string) {
	ti.t.Helper()
	ti.close()
	harness.Eventually(ti.t, 5*time.Second, "mosquitto sees every connection of "+clientID+" end", func() bool {
		log := b.LogTail(100000)
		connects := strings.Count(log, " as "+clientID+" (")
		ends := strings.Count(log, "Client "+clientID+" disconnected") +
			strings.Count(log, "Client "+clientID+" closed its connection.") +
			strings.Count(log, "Client "+clientID+" already connected, closing old connection.")
		return connects == ends
	})
}

// read returns the next message, which must come alone (not a frame's
// batch), or fails the test after readTimeout.
func (ti *testInput) read() (*service.Message, service.AckFunc) {
	ti.t.Helper()
	batch, ack := ti.readBatch()
	if len(batch) != 1 {
		ti.t.Fatalf("read a batch of %d messages, want one", len(batch))
	}
	return batch[0], ack
}

// readBatch returns the next batch or fails the test after readTimeout.
// Like Benthos, it calls Connect again when ReadBatch reports no
// connection.
func (ti *testInput) readBatch() (service.MessageBatch, service.AckFunc) {
	ti.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	for {
		msg, ack, err := ti.in.ReadBatch(ctx)
		if errors.Is(err, service.ErrNotConnected) && ctx.Err() == nil {
			if err := ti.in.Connect(ctx); err != nil && ctx.Err() != nil {
				ti.t.Fatalf("read: no connection within %s: %v", readTimeout, err)
			}
			continue
		}
		if err != nil {
			ti.t.Fatalf("read: %v", err)
		}
		return msg, ack
	}
}

// readNone asserts that no message arrives within wait.
func (ti *testInput) readNone(wait time.Duration) {
	ti.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	batch, _, err := ti.in.ReadBatch(ctx)
	if err == nil {
		ti.t.Fatalf("expected no message within %s, got %d, the first %q on %s", wait, len(batch), body(batch[0]), meta(batch[0], metaTopic))
	}
}

// readAck reads one message, acknowledges it with success and returns its body.
func (ti *testInput) readAck() string {
	ti.t.Helper()
	msg, ack := ti.read()
	if err := ack(context.Background(), nil); err != nil {
		ti.t.Fatalf("ack: %v", err)
	}
	return body(msg)
}

// readAckInOrder reads and acknowledges one message per entry of want and
// fails unless their bodies are want, in order; why says what the order
// proves.
func (ti *testInput) readAckInOrder(why string, want ...string) {
	ti.t.Helper()
	for _, w := range want {
		if got := ti.readAck(); got != w {
			ti.t.Fatalf("read %q, want %q (%s)", got, w, why)
		}
	}
}

func body(m *service.Message) string {
	b, err := m.AsBytes()
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

func meta(m *service.Message, key string) string {
	v, _ := m.MetaGet(key)
	return v
}

// publishQoS publishes payloads to topic at QoS 1 and waits for the PUBACKs.
func publish(t *testing.T, url, topic string, payloads ...string) {
	t.Helper()
	harness.Publish(t, url, topic, harness.Payloads(payloads...))
}
