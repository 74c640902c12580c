package mqttin

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// Scenarios of seed 000 (persistent sessions, startup replay) on mosquitto.

// seedSession creates the persistent session of clientID with topics and
// leaves it, so that what is published next is queued for it offline.
func seedSession(t *testing.T, b *harness.Mosquitto, clientID string, topics ...string) {
	t.Helper()
	ti := openInput(t, inputYAML(b.URL(), clientID, topics))
	ti.closeOnBroker(b, clientID)
}

func numbered(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

func TestOfflineMessagesReplayedOnResume(t *testing.T) {
	b := startBroker(t)
	topics := []string{"a/#", "t/#"}
	seedSession(t, b, "resume", topics...)
	publish(t, b.URL(), "a/x", numbered("m", 5)...)

	ti := openInput(t, inputYAML(b.URL(), "resume", topics))
	ti.readAckInOrder("offline messages in order", numbered("m", 5)...)
	ti.closeExpectMarkerFirst(b, "resume", topics)
}

func TestReplayedMessageUnderFailingOutputComesBackAfterReconnect(t *testing.T) {
	b := startBroker(t)
	topics := []string{"a/#", "t/#"}
	seedSession(t, b, "failing", topics...)
	publish(t, b.URL(), "a/x", "offline")

	ti := openInput(t, inputYAML(b.URL(), "failing", topics))
	for range 2 { // the first attempt and the in-process retry both fail
		msg, ack := ti.read()
		if body(msg) != "offline" {
			t.Fatalf("read %q", body(msg))
		}
		_ = ack(context.Background(), errors.New("output down"))
	}
	ti.closeOnBroker(b, "failing")

	ti = openInput(t, inputYAML(b.URL(), "failing", topics))
	if got := ti.readAck(); got != "offline" {
		t.Fatalf("after reconnect read %q, want the message the failing output never took", got)
	}
	ti.closeExpectMarkerFirst(b, "failing", topics)
}

// Replay never bypasses receive_buffer_size: messages beyond it wait,
// unacknowledged, and move as Read makes room.
func TestReplayBeyondReceiveBufferStaysUnacked(t *testing.T) {
	b := startBroker(t)
	topics := []string{"a/#", "t/#"}
	seedSession(t, b, "rbuf", topics...)
	publish(t, b.URL(), "a/x", numbered("m", 10)...)

	ti := openInput(t, inputYAML(b.URL(), "rbuf", topics, "receive_buffer_size: 2"))
	harness.Eventually(t, 5*time.Second, "all 10 replayed messages reach the input", func() bool {
		return len(ti.in.in.Queued()) == 10
	})
	ti.readAckInOrder("replayed messages in order", numbered("m", 3)...)
	ti.closeOnBroker(b, "rbuf")

	ti = openInput(t, inputYAML(b.URL(), "rbuf", topics, "receive_buffer_size: 2"))
	ti.readAckInOrder("after reconnect; messages waiting beyond receive_buffer_size must stay unacknowledged", numbered("m", 10)[3:]...)
	ti.closeExpectMarkerFirst(b, "rbuf", topics)
}

// More unmatched held messages than session_replay_buffer_size close the
// connection with an error naming the limit, acknowledging none of them.
func TestReplayOverflowFailsClosed(t *testing.T) {
	b := startBroker(t)
	seedSession(t, b, "overflow", "a/#", "b/#", "t/#")
	publish(t, b.URL(), "b/x", numbered("old", 5)...)

	// Connect never succeeds: every connection fails closed.
	ti, _ := startInputWait(t, inputYAML(b.URL(), "overflow", []string{"a/#", "t/#"}, "session_replay_buffer_size: 2"), 500*time.Millisecond)
	harness.Eventually(t, 10*time.Second, "the overflow error is logged", func() bool {
		return ti.logs.Contains("more than session_replay_buffer_size (2)")
	})
	ti.readNone(200 * time.Millisecond)
	ti.closeOnBroker(b, "overflow")

	ti = openInput(t, inputYAML(b.URL(), "overflow", []string{"a/#", "b/#", "t/#"}))
	ti.readAckInOrder("the overflow must not acknowledge anything", numbered("old", 5)...)
	ti.closeExpectMarkerFirst(b, "overflow", []string{"a/#", "b/#", "t/#"})
}

// At session_replay_timeout held messages are dropped locally without ack
// (one warning) and come back on the next resumed connection; matching
// messages flow meanwhile, and afterwards unmatched ones are acknowledged
// and dropped (ordinary routing).
func TestReplayTimeoutDropsWithoutAckAndRedeliversOnNextResume(t *testing.T) {
	b := startBroker(t)
	all := []string{"a/#", "b/#", "t/#"}
	seedSession(t, b, "timeout", all...)
	publish(t, b.URL(), "b/x", "held")
	publish(t, b.URL(), "a/x", "deliverable")

	ti := openInput(t, inputYAML(b.URL(), "timeout", []string{"a/#", "t/#"}, "session_replay_timeout: 500ms"))
	if got := ti.readAck(); got != "deliverable" {
		t.Fatalf("read %q, want the matching message while the other is held", got)
	}
	harness.Eventually(t, 5*time.Second, "the replay timeout warning", func() bool {
		return ti.logs.Contains("dropping 1 held messages")
	})
	publish(t, b.URL(), "b/x", "live") // ordinary routing now: acknowledged and dropped
	ti.readNone(300 * time.Millisecond)
	ti.closeOnBroker(b, "timeout")

	ti = openInput(t, inputYAML(b.URL(), "timeout", all))
	if got := ti.readAck(); got != "held" {
		t.Fatalf("read %q, want the held message, dropped without ack, redelivered", got)
	}
	ti.closeExpectMarkerFirst(b, "timeout", all)
}
