package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// TestOutputBrokerConfirmIsNotDelivery shows the DESIGN's claim: a PUBACK
// only proves the broker accepted a message, not that anyone will get it.
// Mosquitto with max_queued_messages 10 PUBACKs every message for an
// offline persistent subscriber and then silently drops all but 10.
//
//   - confirm: broker — the outbox drains (every record confirmed), yet the
//     subscriber, when it comes back, receives exactly 10 of the 100;
//   - confirm: end_to_end — with the final consumer (the ACKer) offline the
//     same broker PUBACKs the envelopes just the same, but no record leaves
//     the outbox; once the ACKer is online every message reaches it.
func TestOutputBrokerConfirmIsNotDelivery(t *testing.T) {
	const count, maxQueued = 100, 10

	t.Run("broker_confirm_drains_while_offline_subscriber_loses_messages", func(t *testing.T) {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{MaxQueued: maxQueued})
		// Create the subscriber's persistent session, then take it offline.
		sub := harness.Subscribe(t, m.URL(), "offline-consumer", false, "plant/offline")
		sub.Close()

		path := filepath.Join(t.TempDir(), "outbox.db")
		pub := outPublisher{url: m.URL(), outboxPath: path, count: count, topic: "plant/offline", window: 16,
			extra: []string{"envelope: delivery"}}
		p := harness.RunPipeline(t, pub.yaml(), harness.ProcOptions{})
		outWaitAccepted(t, p, count)
		// Every record confirmed by PUBACK: the outbox is empty.
		outWaitDrained(t, p, path, outFromDelivery, count, nil)

		sub = harness.Subscribe(t, m.URL(), "offline-consumer", false, "plant/offline")
		outSettle(sub, 10*time.Second)
		got := outDeliveredSet(outDeliveries(t, sub))
		t.Logf("outbox drained (all %d PUBACKed); the subscriber received %d distinct messages", count, len(got))
		// An offline session's queue holds max_queued_messages: the other
		// 90 were PUBACKed and dropped.
		if len(got) != maxQueued {
			t.Fatalf("the subscriber received %d of %d messages, want exactly max_queued_messages = %d", len(got), count, maxQueued)
		}
	})

	t.Run("end_to_end_keeps_records_until_the_consumer_acks", func(t *testing.T) {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{MaxQueued: maxQueued})
		path := filepath.Join(t.TempDir(), "outbox.db")
		pub := outPublisher{url: m.URL(), outboxPath: path, count: count, topic: "plant/offline", window: 16,
			extra: []string{"confirm: end_to_end", "data_topic: e2e/data", "ack_topic: e2e/acks"}}
		p := harness.RunPipeline(t, pub.yaml(), harness.ProcOptions{})
		outWaitAccepted(t, p, count)
		// Published and PUBACKed over and over (ack_timeout 2s), yet kept.
		harness.Eventually(t, outWait, "a resend after an ACK timeout", func() bool {
			return strings.Contains(p.RunLog(), "no ACK on e2e/acks for event")
		})
		if n := outLastPending(p.RunLog()); n != count {
			t.Fatalf("with the consumer offline the outbox holds %d records, want all %d", n, count)
		}

		acker := harness.StartAcker(t, m.URL(), "e2e/data", "e2e/acks", nil)
		outWaitDrained(t, p, path, outFromIngress, count, func() map[int]bool { return outAckedSet(t, acker, "plant/offline") })
	})
}

// outSettle waits until s has received nothing new for a second (or timeout).
func outSettle(s *harness.Subscriber, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	last, since := -1, time.Now()
	for time.Now().Before(deadline) {
		if n := s.Count(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= time.Second {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
