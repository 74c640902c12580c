package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// packedChain is a packing reliable_mqtt_out (confirm: end_to_end,
// pack.max_events 64, zstd) publishing n events through the broker in to
// a consumer — reliable_mqtt_in with ack_topic → dedup_ledger →
// reliable_mqtt_out, ledger and outbox in one file — whose output goes to
// a second broker, out, where sub reads it. watch counts what crosses
// events/in.
type packedChain struct {
	in, out             *harness.Mosquitto
	sub, watch          *harness.Subscriber
	consumer, publisher *harness.Proc
	consumerDir         string
	n                   int
}

func startPackedChain(t *testing.T, n int, in harness.MosquittoOptions) *packedChain {
	t.Helper()
	c := &packedChain{in: harness.StartMosquitto(t, in), out: harness.StartMosquitto(t, harness.MosquittoOptions{}), consumerDir: t.TempDir(), n: n}
	c.sub = harness.Subscribe(t, c.out.URL(), "chain-out", true, "events/out")
	c.watch = harness.Subscribe(t, c.in.URL(), "chain-watch", true, "events/in")
	clientID := "chain-consumer"
	ledgerSession(t, c.in.URL(), clientID)
	c.consumer = harness.RunPipeline(t, fmt.Sprintf(`
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
`, c.in.URL(), clientID, c.out.URL()), harness.ProcOptions{Dir: c.consumerDir})
	c.publisher = harness.RunPipeline(t, fmt.Sprintf(`
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
`, n, c.in.URL()), harness.ProcOptions{Dir: t.TempDir()})
	return c
}

// arrived waits until a fraction of the n events reached the subscriber.
func (c *packedChain) arrived(t *testing.T, num, den int) {
	t.Helper()
	harness.Eventually(t, 60*time.Second, "more events at the subscriber", func() bool {
		return len(ledgerDeliveries(t, c.sub)) >= num*c.n/den
	})
}

// finish waits until every event reached the subscriber and both outboxes
// drained, then checks the consumer's file: exactly one record and one
// ledger key per event. Every publisher's frame was ACKed by its ID, and
// some publishes were frames.
func (c *packedChain) finish(t *testing.T, what string) {
	t.Helper()
	harness.Eventually(t, 120*time.Second, "every event at the subscriber", func() bool {
		return len(ledgerDeliveries(t, c.sub)) >= c.n
	})
	harness.Eventually(t, 60*time.Second, "the publisher's outbox to drain", func() bool {
		return strings.Contains(harness.LastStatsLine(c.publisher.RunLog()), "; 0 pending (0 bytes)")
	})
	if !c.consumer.WaitForLog("; 0 pending (", 20*time.Second) {
		t.Fatal("the consumer's outbox never drained")
	}
	if err := c.consumer.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.publisher.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	everyEventDelivered(t, c.sub, c.n)
	enqueued, pending, keys := ledgerFileCounts(t, filepath.Join(c.consumerDir, "consumer.db"))
	frames, publishes := c.watch.Frames(), c.watch.Count()
	t.Logf("%d events, %d publishes seen on events/in (%d frames), %s: enqueued %d, %d pending, %d ledger keys", c.n, publishes, frames, what, enqueued, pending, keys)
	if enqueued != uint64(c.n) || keys != c.n {
		t.Fatalf("the consumer enqueued %d records and holds %d keys for %d events; want exactly %d each", enqueued, keys, c.n, c.n)
	}
	if frames == 0 {
		t.Fatal("no publish on events/in was a frame: the test did not test frames")
	}
}

// TestPackedPublisherToKilledConsumerAppliesEachEventOnce: the packed
// chain's consumer is SIGKILLed five times, spread over the stream, while
// frames arrive. Every event becomes exactly one record and one ledger key
// at the consumer and reaches the subscriber, the publisher's outbox
// drains (every frame was ACKed, by the frame's ID), and the publishes
// were frames.
func TestPackedPublisherToKilledConsumerAppliesEachEventOnce(t *testing.T) {
	const n, kills = 2000, 5
	c := startPackedChain(t, n, harness.MosquittoOptions{})
	rng := testRand(t, 13)
	for k := range kills {
		// Spread over the stream: the k-th kill once k/(kills+1) of it
		// arrived, a random moment later.
		c.arrived(t, k+1, kills+2)
		time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
		c.consumer.Kill()
		t.Logf("kill %d: %d distinct events at the subscriber", k+1, len(ledgerDeliveries(t, c.sub)))
		c.consumer.Restart()
	}
	c.finish(t, fmt.Sprintf("%d consumer kills", kills))
}

// TestPackedChainAcrossBrokerRestartsAppliesEachEventOnce: the packed
// chain's broker between publisher and consumer restarts three times,
// spread over the stream: stopped for a second and started (persistence
// on), or SIGKILLed without persistence, forgetting every session, queued
// frame and frame in flight (the publisher resends what was not ACKed;
// the consumer resubscribes). Every event is applied exactly once and
// reaches the subscriber, and the publisher's outbox drains.
func TestPackedChainAcrossBrokerRestartsAppliesEachEventOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts harness.MosquittoOptions
		down func(m *harness.Mosquitto)
	}{
		{"graceful", harness.MosquittoOptions{Persistence: true}, (*harness.Mosquitto).Stop},
		{"sigkill_no_persistence", harness.MosquittoOptions{}, (*harness.Mosquitto).Kill},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n, restarts = 3000, 3
			c := startPackedChain(t, n, tc.opts)
			rng := testRand(t, 17)
			for k := range restarts {
				c.arrived(t, k+1, restarts+2)
				time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
				tc.down(c.in)
				time.Sleep(time.Second)
				c.in.Start()
				t.Logf("restart %d: %d distinct events at the subscriber", k+1, len(ledgerDeliveries(t, c.sub)))
			}
			if got := len(ledgerDeliveries(t, c.sub)); got >= n {
				t.Fatalf("all %d events arrived before the last restart was over: the test did not test restarts mid-stream", got)
			}
			c.finish(t, fmt.Sprintf("%d broker restarts (%s)", restarts, tc.name))
		})
	}
}
