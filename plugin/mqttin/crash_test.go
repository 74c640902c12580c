package mqttin

import (
	"fmt"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// A consumer pipeline (the real binary: reliable_mqtt_in → sleep →
// reliable_mqtt_out in direct mode) is SIGKILLed with messages in flight
// and restarted with the same client_id: every message reaches the output
// at least once. Nothing was PUBACKed before the output confirmed it, so
// whatever the crash interrupted is redelivered by the broker.
func TestCrashedConsumerLosesNothing(t *testing.T) {
	const n = 200
	b := harness.StartMosquitto(t, harness.MosquittoOptions{MaxInflight: 40})
	out := harness.Subscribe(t, b.URL(), "crash-watcher", false, "done/#")
	// Create the consumer's session so that the backlog is queued for it.
	harness.Subscribe(t, b.URL(), "crash-consumer", false, "work/#").Close()

	payloads := make([]string, n)
	for i := range payloads {
		payloads[i] = fmt.Sprintf("m%03d", i)
	}
	publish(t, b.URL(), "work/x", payloads...)

	p := harness.RunPipeline(t, fmt.Sprintf(`
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: crash-consumer
    topics: [ "work/#" ]
    qos: 1
pipeline:
  processors:
    - sleep:
        duration: 10ms
output:
  reliable_mqtt_out:
    urls: [ %q ]
    topic: done/x
    outbox:
      enabled: false
    max_in_flight: 8
`, b.URL(), b.URL()), harness.ProcOptions{})

	if !out.WaitCount(30, 30*time.Second) {
		t.Fatalf("the consumer forwarded only %d messages before the crash", out.Count())
	}
	p.Kill()
	before := out.Count()
	if before >= n {
		t.Fatalf("all %d messages were forwarded before the kill; the test needs messages in flight", n)
	}
	p.Restart()

	harness.Eventually(t, 60*time.Second, "every message forwarded at least once", func() bool {
		seen := map[string]bool{}
		for _, m := range out.Messages() {
			seen[string(m.Payload)] = true
		}
		return len(seen) == n
	})
	t.Logf("forwarded %d before the kill, %d copies in all for %d messages", before, out.Count(), n)
}
