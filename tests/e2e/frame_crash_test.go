package e2e

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// frameStream packs stream (event IDs in publish order, with duplicates)
// into frames of 1 to 16 consecutive events of LedgerEvent payloads,
// zstd-compressed; a frame ends early rather than hold an ID twice.
func frameStream(t *testing.T, rng *rand.Rand, stream []string) [][]byte {
	t.Helper()
	var frames [][]byte
	var cur []frame.Event
	flush := func() {
		if len(cur) == 0 {
			return
		}
		b, _, err := frame.Encode(cur, frame.Options{Compression: frame.Zstd})
		if err != nil {
			t.Fatal(err)
		}
		frames, cur = append(frames, b), nil
	}
	size := 1 + rng.IntN(16)
	for _, id := range stream {
		if len(cur) == size || slices.ContainsFunc(cur, func(e frame.Event) bool { return e.ID == id }) {
			flush()
			size = 1 + rng.IntN(16)
		}
		cur = append(cur, frame.Event{ID: id, Payload: harness.LedgerEvent(id)})
	}
	flush()
	return frames
}

// TestFrameCrashLoopEnqueuesEveryEventOnce is
// TestLedgerRandomCrashLoopEnqueuesEveryEventOnce with frames: the
// producer publishes the events, each one to three times, packed into
// frames of 1 to 16 events, while the consumer (reliable_mqtt_in with
// envelope: delivery → dedup_ledger → reliable_mqtt_out, ledger and outbox
// in one file) is SIGKILLed six times at random moments while the frames
// arrive. Every event becomes exactly one outbox record and one ledger key,
// and reaches the subscriber.
func TestFrameCrashLoopEnqueuesEveryEventOnce(t *testing.T) {
	const n, kills = 300, 6
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	sub := harness.Subscribe(t, m.URL(), "frame-loop-out", true, "events/out")
	clientID := "frame-loop-consumer"
	ledgerSession(t, m.URL(), clientID)
	dir := t.TempDir()
	relay := ledgerRelay{inURL: m.URL(), outURL: m.URL(), clientID: clientID, dbPath: "consumer.db", withLedger: true, outbox: true, envelope: "delivery"}
	p := harness.RunPipeline(t, relay.yaml(), harness.ProcOptions{Dir: dir})

	rng := testRand(t, 11)
	stream := dupStream(rng, n)
	frames := frameStream(t, rng, stream)
	crashLoop(t, p, rng, kills, harness.PublishChunks(t, m.URL(), "events/in", frames, 1, 40*time.Millisecond), sub, n)
	sentinel := frameStream(t, rng, []string{"sentinel"})
	harness.Publish(t, m.URL(), "events/in", sentinel)
	harness.Eventually(t, 30*time.Second, "the sentinel at the subscriber", func() bool {
		return ledgerDeliveries(t, sub)["sentinel"] > 0
	})
	if !p.WaitForLog("; 0 pending (", 20*time.Second) {
		t.Fatal("outbox never drained")
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	everyEventDelivered(t, sub, n)
	enqueued, pending, keys := ledgerFileCounts(t, filepath.Join(dir, "consumer.db"))
	t.Logf("%d events, %d copies in %d frames, %d kills: enqueued %d records (incl. sentinel), %d pending, %d ledger keys",
		n, len(stream), len(frames), kills, enqueued, pending, keys)
	if enqueued != n+1 || keys != n+1 {
		t.Fatalf("outbox enqueued %d records and the ledger holds %d keys for %d events + sentinel; want exactly %d each", enqueued, keys, n, n+1)
	}
}
