package mqttin

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// closeExpectMarkerFirst closes ti on the broker, reconnects as clientID,
// publishes a marker and asserts it is the next message: proof that nothing
// unacknowledged was left in the session.
func (ti *testInput) closeExpectMarkerFirst(b *harness.Mosquitto, clientID string, topics []string, extra ...string) {
	t := ti.t
	t.Helper()
	ti.closeOnBroker(b, clientID)
	ti = openInput(t, inputYAML(b.URL(), clientID, topics, extra...))
	publish(t, b.URL(), "t/marker", "marker")
	if got := ti.readAck(); got != "marker" {
		t.Fatalf("first message after reconnect = %q, want the marker: a message was left unacknowledged", got)
	}
	ti.closeOnBroker(b, clientID)
}

// A PUBACK goes out only after the pipeline acknowledged the message, and
// in receive order: acking B and C while A is pending sends nothing, so all
// three come back on the next connection.
func TestPubackOnlyAfterPipelineAckAndInReceiveOrder(t *testing.T) {
	b := startBroker(t)
	topics := []string{"t/#"}
	ti := openInput(t, inputYAML(b.URL(), "order", topics))
	publish(t, b.URL(), "t/x", "A", "B", "C")
	var acks []func()
	for _, want := range []string{"A", "B", "C"} {
		msg, ack := ti.read()
		if got := body(msg); got != want {
			t.Fatalf("read %q, want %q", got, want)
		}
		acks = append(acks, func() { _ = ack(context.Background(), nil) })
	}
	acks[2]()
	acks[1]()
	ti.closeOnBroker(b, "order") // A never acknowledged: B and C must wait behind it

	ti = openInput(t, inputYAML(b.URL(), "order", topics))
	ti.readAckInOrder("after reconnect; B and C must not have been acknowledged before A", "A", "B", "C")
	ti.closeExpectMarkerFirst(b, "order", topics)
}

// A rejected message is never acknowledged: the input delivers it again,
// with a fresh hook list per attempt, until the pipeline succeeds.
func TestRejectedMessageIsRetriedWithFreshHooks(t *testing.T) {
	b := startBroker(t)
	topics := []string{"t/#"}
	ti := openInput(t, inputYAML(b.URL(), "retry", topics))
	publish(t, b.URL(), "t/x", "payload")

	var mu sync.Mutex
	var results []error
	var lists []*commit.Hooks
	for attempt := 1; attempt <= 3; attempt++ {
		msg, ack := ti.read()
		if body(msg) != "payload" {
			t.Fatalf("attempt %d: read %q", attempt, body(msg))
		}
		hooks := commit.HooksFrom(msg.Context())
		if hooks == nil {
			t.Fatal("message carries no delivery hooks")
		}
		for _, prev := range lists {
			if prev == hooks {
				t.Fatalf("attempt %d reuses the hook list of an earlier attempt", attempt)
			}
		}
		lists = append(lists, hooks)
		if err := hooks.Register(func(_ context.Context, result error) error {
			mu.Lock()
			defer mu.Unlock()
			results = append(results, result)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var verdict error
		if attempt < 3 {
			verdict = errors.New("output down")
		}
		_ = ack(context.Background(), verdict)
	}
	mu.Lock()
	if len(results) != 3 || results[0] == nil || results[1] == nil || results[2] != nil {
		t.Fatalf("hooks saw %v, want [error error nil]", results)
	}
	mu.Unlock()
	ti.readNone(300 * time.Millisecond)
	ti.closeExpectMarkerFirst(b, "retry", topics)
}

// A hook that fails on success turns the attempt into a failure: no PUBACK,
// another attempt.
func TestFailingHookPreventsAck(t *testing.T) {
	b := startBroker(t)
	topics := []string{"t/#"}
	ti := openInput(t, inputYAML(b.URL(), "hookfail", topics))
	publish(t, b.URL(), "t/x", "payload")

	msg, ack := ti.read()
	if err := commit.HooksFrom(msg.Context()).Register(func(context.Context, error) error {
		return errors.New("ledger unavailable")
	}); err != nil {
		t.Fatal(err)
	}
	_ = ack(context.Background(), nil)
	msg, ack = ti.read()
	if body(msg) != "payload" {
		t.Fatalf("retry read %q", body(msg))
	}
	_ = ack(context.Background(), nil)
	ti.closeExpectMarkerFirst(b, "hookfail", topics)
}

// The hooks run before the PUBACK: a hook that cuts the connection makes
// the PUBACK impossible (an ack of a lost connection is never sent on the
// next one), so the broker redelivers the message.
func TestHooksRunBeforePuback(t *testing.T) {
	b := startBroker(t)
	proxy := harness.NewProxy(t, b.Addr())
	topics := []string{"t/#"}
	ti := openInput(t, inputYAML(proxy.URL(), "hookorder", topics))
	publish(t, b.URL(), "t/x", "payload")

	msg, ack := ti.read()
	firstConn := ti.in.client.Current()
	if err := commit.HooksFrom(msg.Context()).Register(func(context.Context, error) error {
		proxy.Cut()
		harness.Eventually(t, 5*time.Second, "the input notices the cut", func() bool { return !firstConn.Alive() })
		proxy.Restore()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_ = ack(context.Background(), nil)

	msg, ack = ti.read()
	if body(msg) != "payload" {
		t.Fatalf("after reconnect read %q, want the redelivered message", body(msg))
	}
	if meta(msg, metaDuplicate) != "true" {
		t.Fatalf("mqtt_duplicate = %q: mosquitto marks its redelivery of an unacknowledged message", meta(msg, metaDuplicate))
	}
	_ = ack(context.Background(), nil)
	ti.closeExpectMarkerFirst(b, "hookorder", topics)
}
