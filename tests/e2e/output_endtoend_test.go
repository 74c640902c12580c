package e2e

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// outAckedSet is the set of n the ACKer has seen (and ACKed), checking that
// every envelope carries evt-<n> and the configured destination topic.
func outAckedSet(t *testing.T, a *harness.Acker, topic string) map[int]bool {
	t.Helper()
	set := map[int]bool{}
	for _, in := range a.Seen() {
		n := outN(t, in.Payload)
		if want := "evt-" + strconv.Itoa(n); in.EventID != want || in.Topic != topic {
			t.Fatalf("ingress envelope for n=%d has event ID %q and topic %q, want %q and %q", n, in.EventID, in.Topic, want, topic)
		}
		set[n] = true
	}
	return set
}

// TestOutputEndToEndConfirmsEverythingAcrossABrokerRestart runs an
// end_to_end publisher against a test ACKer and restarts mosquitto in the
// middle of the stream, once gracefully (persistence on) and once by
// SIGKILL with no persistence at all, so the broker forgets every queued
// message and every session. Envelopes the broker accepted but never
// handed to the ACKer get no ACK, time out and are resent: in the end every
// accepted message has been ACKed and the outbox is empty. (With confirm:
// broker the SIGKILL case would lose whatever the broker had PUBACKed.)
// Each case runs unpacked and packed (pack.max_events 64: the frames in
// flight at the restart are resent whole, by their records).
func TestOutputEndToEndConfirmsEverythingAcrossABrokerRestart(t *testing.T) {
	cases := []struct {
		name    string
		opts    harness.MosquittoOptions
		restart func(m *harness.Mosquitto)
	}{
		{"graceful", harness.MosquittoOptions{Persistence: true, MaxInflight: 1000}, func(m *harness.Mosquitto) {
			m.Stop()
			time.Sleep(time.Second)
			m.Start()
		}},
		{"sigkill_no_persistence", harness.MosquittoOptions{MaxInflight: 1000}, func(m *harness.Mosquitto) {
			m.Kill()
			time.Sleep(time.Second)
			m.Start()
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			outPacking(t, func(t *testing.T, pack bool) {
				const count = 6000 // at 1/ms: the stream outlasts start-up, 100 ACKs and the restart
				m := harness.StartMosquitto(t, c.opts)
				acker := harness.StartAcker(t, m.URL(), "e2e/data", "e2e/acks", nil)
				path := filepath.Join(t.TempDir(), "outbox.db")
				pub := outPublisher{url: m.URL(), outboxPath: path, count: count, topic: "plant/line1", window: 64,
					extra: []string{"confirm: end_to_end", "data_topic: e2e/data", "ack_topic: e2e/acks"}}
				if pack {
					pub.extra = append(pub.extra, "pack: { max_events: 64 }")
				}
				p := harness.RunPipeline(t, pub.yaml(), harness.ProcOptions{})
				harness.Eventually(t, 30*time.Second, "the first ACKs", func() bool { return len(acker.Seen()) >= 100 })

				c.restart(m)
				if len(outAccepted(t, p.RunLog())) >= count {
					t.Fatal("the stream ended before the broker restart: the test did not test a restart")
				}

				outWaitDrained(t, p, path, outFromIngress, count, func() map[int]bool { return outAckedSet(t, acker, "plant/line1") })
				if lost := outMissing(outAccepted(t, p.Log()), outAckedSet(t, acker, "plant/line1")); len(lost) > 0 {
					t.Fatalf("accepted but never ACKed: %v", lost)
				}
				t.Logf("%d envelopes ACKed for %d messages, %d frames", len(acker.Seen()), count, acker.Frames())
				if pack && acker.Frames() == 0 {
					t.Fatal("the ACKer got no frame: the test did not test packing")
				}
			})
		})
	}
}
