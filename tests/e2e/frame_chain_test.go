package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// TestPackedPublisherToKilledConsumerAppliesEachEventOnce: a packing
// reliable_mqtt_out (confirm: end_to_end, pack.max_events 64, zstd)
// publishes n events through mosquitto to a consumer — reliable_mqtt_in
// with ack_topic → dedup_ledger → reliable_mqtt_out, ledger and outbox in
// one file — that is SIGKILLed five times, spread over the stream, while
// frames arrive. Every
// event becomes exactly one record and one ledger key at the consumer and
// reaches the subscriber, the publisher's outbox drains (every frame was
// ACKed, by the frame's ID), and the publishes were frames.
func TestPackedPublisherToKilledConsumerAppliesEachEventOnce(t *testing.T) {
	const n, kills = 2000, 5
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	sub := harness.Subscribe(t, m.URL(), "chain-out", true, "events/out")
	watch := harness.Subscribe(t, m.URL(), "chain-watch", true, "events/in")
	clientID := "chain-consumer"
	ledgerSession(t, m.URL(), clientID)
	consumerDir := t.TempDir()
	consumer := harness.RunPipeline(t, fmt.Sprintf(`
http:
  enabled: false
logger:
  level: INFO
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: %s
    topics: [ "events/in" ]
    envelope: ingress
    ack_topic: events/acks
pipeline:
  processors:
    - dedup_ledger: { path: consumer.db }
output:
  reject_errored:
    reliable_mqtt_out:
      urls: [ %q ]
      topic: events/out
      event_id: ${! meta("event_id") }
      envelope: delivery
      outbox: { path: consumer.db }
      stats_interval: 100ms
`, m.URL(), clientID, m.URL()), harness.ProcOptions{Dir: consumerDir})
	pubDir := t.TempDir()
	publisher := harness.RunPipeline(t, fmt.Sprintf(`
http:
  enabled: false
logger:
  level: INFO
input:
  generate:
    interval: 2ms
    # Generating stops after n readings; the process stays up so that its
    # outbox drains (an input that ends would end the process).
    mapping: |
      let seq = counter()
      meta event_id = "ev-%%d".format($seq)
      root = if $seq > %d { deleted() } else { { "seq": $seq, "reading": "temperature 21.5 C, humidity 48 %%%%, pressure 1013 hPa" } }
pipeline:
  threads: 1
output:
  reliable_mqtt_out:
    urls: [ %q ]
    client_id: chain-publisher
    topic: dest/readings
    event_id: ${! meta("event_id") }
    confirm: end_to_end
    data_topic: events/in
    ack_topic: events/acks
    outbox: { path: publisher.db }
    stats_interval: 100ms
    pack: { max_events: 64, compression: zstd }
`, n, m.URL()), harness.ProcOptions{Dir: pubDir})

	rng := testRand(t, 13)
	for k := range kills {
		// Spread over the stream: the k-th kill once k/(kills+1) of it
		// arrived, a random moment later.
		harness.Eventually(t, 60*time.Second, "more events at the subscriber", func() bool {
			return len(ledgerDeliveries(t, sub)) >= (k+1)*n/(kills+2)
		})
		time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
		consumer.Kill()
		t.Logf("kill %d: %d distinct events at the subscriber", k+1, len(ledgerDeliveries(t, sub)))
		consumer.Restart()
	}
	harness.Eventually(t, 120*time.Second, "every event at the subscriber", func() bool {
		return len(ledgerDeliveries(t, sub)) >= n
	})
	harness.Eventually(t, 60*time.Second, "the publisher's outbox to drain", func() bool {
		return strings.Contains(harness.LastStatsLine(publisher.RunLog()), "; 0 pending (0 bytes)")
	})
	if !consumer.WaitForLog("; 0 pending (", 20*time.Second) {
		t.Fatal("the consumer's outbox never drained")
	}
	if err := consumer.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := publisher.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	everyEventDelivered(t, sub, n)
	enqueued, pending, keys := ledgerFileCounts(t, filepath.Join(consumerDir, "consumer.db"))
	frames, publishes := watch.Frames(), watch.Count()
	t.Logf("%d events in %d publishes (%d frames), %d consumer kills: enqueued %d, %d pending, %d ledger keys", n, publishes, frames, kills, enqueued, pending, keys)
	if enqueued != n || keys != n {
		t.Fatalf("the consumer enqueued %d records and holds %d keys for %d events; want exactly %d each", enqueued, keys, n, n)
	}
	if frames == 0 {
		t.Fatal("no publish on events/in was a frame: the test did not test frames")
	}
}
