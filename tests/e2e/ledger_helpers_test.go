package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// ledgerRelay describes a consumer pipeline: reliable_mqtt_in (persistent
// session, QoS 1) → optional dedup_ledger → reliable_mqtt_out, with the
// ledger and the outbox in one file.
type ledgerRelay struct {
	inURL, outURL string
	clientID      string
	dbPath        string // relative to the process's working dir
	withLedger    bool
	commitMode    string // "" = auto
	outbox        bool   // false: direct mode (publish_timeout bounds each write)
	ledgerPath    string // ledger file when it differs from the outbox's
	envelope      string // the input's envelope ("": none); frames need one
}

func (r ledgerRelay) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, `
http:
  enabled: false
logger:
  level: INFO
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: %s
    clean_session: false
    topics: [ "events/in" ]
    qos: 1
`, r.inURL, r.clientID)
	if r.envelope != "" {
		fmt.Fprintf(&b, "    envelope: %s\n", r.envelope)
	}
	if r.withLedger {
		path := r.ledgerPath
		if path == "" {
			path = r.dbPath
		}
		fmt.Fprintf(&b, `pipeline:
  processors:
    - dedup_ledger:
        path: %s
        key: ${! json("event_id").or("") }
        namespace: ${! json("producer").or("") }
`, path)
		if r.commitMode != "" {
			fmt.Fprintf(&b, "        commit: %s\n", r.commitMode)
		}
	}
	outbox := fmt.Sprintf("    outbox:\n      path: %s\n    stats_interval: 100ms\n", r.dbPath)
	if !r.outbox {
		outbox = "    outbox:\n      enabled: false\n    publish_timeout: 1s\n"
	}
	fmt.Fprintf(&b, `output:
  reject_errored:
    reliable_mqtt_out:
      urls: [ %q ]
      topic: events/out
      event_id: ${! json("event_id") }
      envelope: delivery
%s`, r.outURL, indent(outbox, "  "))
	return b.String()
}

func indent(s, by string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = by + lines[i]
	}
	return strings.Join(lines, "\n") + "\n"
}

// ledgerEvent, dupStream and publishStream: see tests/harness/stream.go.
func ledgerEvent(id string) []byte             { return harness.LedgerEvent(id) }
func dupStream(rng *rand.Rand, n int) []string { return harness.DupStream(rng, n) }
func publishStream(t *testing.T, url string, stream []string, chunk int, pause time.Duration) <-chan struct{} {
	return harness.PublishStream(t, url, stream, chunk, pause)
}

// ledgerSession creates the consumer's persistent session (subscription on
// events/in at QoS 1) before the consumer first runs, so events published
// meanwhile are queued for it by the broker.
func ledgerSession(t *testing.T, url, clientID string) {
	t.Helper()
	s := harness.Subscribe(t, url, clientID, false, "events/in")
	s.Close()
}

// ledgerDeliveries counts, per event ID, the delivery envelopes the
// subscriber received (every publish, duplicates included).
func ledgerDeliveries(t *testing.T, s *harness.Subscriber) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range s.Messages() {
		var env struct {
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(m.Payload, &env); err != nil || env.EventID == "" {
			t.Fatalf("subscriber got a message that is not a delivery envelope: %q", m.Payload)
		}
		out[env.EventID]++
	}
	return out
}

// ledgerFileCounts reads a stopped pipeline's bbolt file: how many records
// the outbox ever enqueued (its sequence only grows), how many are still
// pending, and how many keys the ledger holds.
func ledgerFileCounts(t *testing.T, path string) (enqueued uint64, pending, keys int) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte("outbox/records")); b != nil {
			enqueued = b.Sequence()
			pending = b.Stats().KeyN
		}
		if b := tx.Bucket([]byte("ledger/keys")); b != nil {
			keys = b.Stats().KeyN
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return enqueued, pending, keys
}

// ledgerSentinel publishes one more event and waits for it at the
// subscriber: the broker delivers a session's queue in order and the
// output publishes FIFO, so everything before it has been handled.
func ledgerSentinel(t *testing.T, url string, sub *harness.Subscriber, id string, timeout time.Duration) {
	t.Helper()
	harness.Publish(t, url, "events/in", [][]byte{ledgerEvent(id)})
	harness.Eventually(t, timeout, "sentinel "+id+" at the subscriber", func() bool {
		return ledgerDeliveries(t, sub)[id] > 0
	})
}

// crashLoop SIGKILLs and restarts p kills times, at random moments while
// the producer publishes, then waits (bounded) for the producer to finish
// and for every one of the n events at the subscriber.
func crashLoop(t *testing.T, p *harness.Proc, rng *rand.Rand, kills int, published <-chan struct{}, sub *harness.Subscriber, n int) {
	t.Helper()
	for k := range kills {
		time.Sleep(time.Duration(150+rng.IntN(500)) * time.Millisecond)
		p.Kill()
		t.Logf("kill %d: %d distinct events published so far", k+1, len(ledgerDeliveries(t, sub)))
		p.Restart()
	}
	select {
	case <-published:
	case <-time.After(60 * time.Second):
		t.Fatal("producer did not finish within 60s")
	}
	harness.Eventually(t, 60*time.Second, "every event at the subscriber", func() bool {
		return len(ledgerDeliveries(t, sub)) >= n
	})
}

// everyEventDelivered fails the test unless the subscriber received each
// of ev-1..ev-n, and returns how many extra copies it received.
func everyEventDelivered(t *testing.T, sub *harness.Subscriber, n int) (extra int) {
	t.Helper()
	got := ledgerDeliveries(t, sub)
	for i := 1; i <= n; i++ {
		c := got[fmt.Sprintf("ev-%d", i)]
		if c == 0 {
			t.Errorf("event ev-%d never delivered", i)
		}
		extra += max(c-1, 0)
	}
	return extra
}
