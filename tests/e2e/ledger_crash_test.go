package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/failpoint"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// seedRun reproduces seed 001 in Benthos: the consumer commits the event's
// effect (the outbox append) and is SIGKILLed before its PUBACK; restarted,
// it resumes its session and the broker redelivers the event.
//
// To make the window deterministic the restarted consumer first reaches
// only its output: its input goes through a proxy that stays cut until the
// first outbox record has been published and confirmed (so the outbox no
// longer holds it and cannot absorb the copy by itself). Then the proxy
// is restored and the broker redelivers.
//
// It returns how many outbox records the event produced (the effect: the
// seed's counter) and how many times the subscriber received it.
func seedRun(t *testing.T, withLedger bool) (enqueued uint64, published int, keys int) {
	t.Helper()
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	proxy := harness.NewProxy(t, m.Addr())
	suffix := fmt.Sprintf("%v-%d", withLedger, time.Now().UnixNano())
	sub := harness.Subscribe(t, m.URL(), "seed-out-"+suffix, true, "events/out")
	clientID := "seed-consumer-" + suffix
	ledgerSession(t, m.URL(), clientID)

	dir := t.TempDir()
	relay := ledgerRelay{inURL: proxy.URL(), outURL: m.URL(), clientID: clientID, dbPath: "consumer.db", withLedger: withLedger, outbox: true}

	// Run 1: dies right after the outbox append (and, with the ledger, the
	// key in the same transaction) committed; no PUBACK was sent.
	p1 := harness.RunPipeline(t, relay.yaml(), harness.ProcOptions{Dir: dir, Env: []string{failpoint.EnvVar + "=" + failpoint.OutboxAppended}})
	harness.Publish(t, m.URL(), "events/in", [][]byte{ledgerEvent("batch-42")})
	if code, err := p1.Wait(30 * time.Second); err != nil {
		t.Fatalf("consumer never reached the failpoint: %v\n%s", err, p1.Log())
	} else if code != -1 {
		t.Fatalf("consumer exited with %d, want death by SIGKILL\n%s", code, p1.Log())
	}

	// Run 2, without the failpoint: the pending record is published first.
	proxy.Cut()
	p2 := harness.RunPipeline(t, relay.yaml(), harness.ProcOptions{Dir: dir})
	harness.Eventually(t, 20*time.Second, "the committed record to be published", func() bool {
		return ledgerDeliveries(t, sub)["batch-42"] >= 1
	})
	if !p2.WaitForLog("; 0 pending (", 20*time.Second) {
		t.Fatal("the published record never left the outbox")
	}
	// The consumer reconnects to its session; the broker redelivers.
	proxy.Restore()
	ledgerSentinel(t, m.URL(), sub, "sentinel", 30*time.Second)
	// The subscriber has the sentinel; its record leaves the outbox once the
	// PUBACK's removal commits, which a stop could otherwise overtake. A
	// stats line logged after the receipt that shows 0 pending says so.
	seen := len(p2.RunLog())
	harness.Eventually(t, 20*time.Second, "the sentinel's record to leave the outbox", func() bool {
		return strings.Contains(harness.LastStatsLine(p2.RunLog()[seen:]), "; 0 pending (")
	})
	if err := p2.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	total, pending, keys := ledgerFileCounts(t, filepath.Join(dir, "consumer.db"))
	if pending != 0 {
		t.Fatalf("%d records still pending", pending)
	}
	return total - 1, ledgerDeliveries(t, sub)["batch-42"], keys // minus the sentinel
}

// TestLedgerCrashAfterCommitBeforeAckEnqueuesOnce is seed 001's table, with
// the real binary, Mosquitto and SIGKILL:
//
//	blind:  the redelivered event is enqueued a second time (2 records);
//	ledger: the key committed with the record, so the copy is dropped
//	        (1 record).
//
// The effect (the seed's counter) is the number of outbox records. Publishes
// are logged too: they are at least once, so a record the sender published
// in the instant before the SIGKILL is published again after the restart.
func TestLedgerCrashAfterCommitBeforeAckEnqueuesOnce(t *testing.T) {
	var blindEnq, ledgerEnq uint64
	var blindPub, ledgerPub, ledgerKeys int
	t.Run("blind", func(t *testing.T) {
		blindEnq, blindPub, _ = seedRun(t, false)
		if blindEnq != 2 || blindPub < 2 {
			t.Fatalf("without the ledger: enqueued %d, published %d; want 2 records and at least 2 publishes (the crash window this test reproduces did not open)", blindEnq, blindPub)
		}
	})
	t.Run("ledger", func(t *testing.T) {
		ledgerEnq, ledgerPub, ledgerKeys = seedRun(t, true)
		// The effect is the outbox record: exactly one. Its publish is at
		// least once: the sender may publish the record in the instant
		// between the commit and the SIGKILL, and its removal never
		// commits, so run 2 publishes it again (same event ID).
		if ledgerEnq != 1 || ledgerPub < 1 || ledgerPub > 2 {
			t.Fatalf("with the ledger: enqueued %d, published %d; want exactly 1 record, published once (twice if published before the kill)", ledgerEnq, ledgerPub)
		}
		if ledgerKeys != 2 { // batch-42 and the sentinel
			t.Fatalf("ledger holds %d keys, want 2", ledgerKeys)
		}
	})
	t.Logf("blind:  enqueued=%d published=%d", blindEnq, blindPub)
	t.Logf("ledger: enqueued=%d published=%d ledger_keys=%d", ledgerEnq, ledgerPub, ledgerKeys)
}

// TestLedgerRandomCrashLoopEnqueuesEveryEventOnce: a producer publishes N
// events, each one to three times (random duplicates, some far apart),
// while the consumer (reliable_mqtt_in → dedup_ledger → reliable_mqtt_out,
// ledger and outbox in one file) is SIGKILLed at random moments six times.
//
// What is asserted, precisely:
//   - enqueued exactly once: the outbox file's record sequence (it only
//     grows) is N + 1 (the sentinel) — every event became exactly one
//     outbox record, across all crashes;
//   - delivered: the subscriber saw every one of the N event IDs;
//   - publishes are at least once, not exactly once: a record published
//     just before a kill, whose removal had not committed, is published
//     again after the restart under the same event ID. Those extra
//     publishes are logged, not forbidden; a consumer downstream drops
//     them by event ID (another dedup_ledger).
func TestLedgerRandomCrashLoopEnqueuesEveryEventOnce(t *testing.T) {
	const n, kills = 300, 6
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	sub := harness.Subscribe(t, m.URL(), "loop-out", true, "events/out")
	clientID := "loop-consumer"
	ledgerSession(t, m.URL(), clientID)
	dir := t.TempDir()
	relay := ledgerRelay{inURL: m.URL(), outURL: m.URL(), clientID: clientID, dbPath: "consumer.db", withLedger: true, outbox: true}
	p := harness.RunPipeline(t, relay.yaml(), harness.ProcOptions{Dir: dir})

	rng := testRand(t, 7)
	stream := dupStream(rng, n)
	crashLoop(t, p, rng, kills, publishStream(t, m.URL(), stream, 25, 60*time.Millisecond), sub, n)
	ledgerSentinel(t, m.URL(), sub, "sentinel", 30*time.Second)
	if !p.WaitForLog("; 0 pending (", 20*time.Second) {
		t.Fatal("outbox never drained")
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	extra := everyEventDelivered(t, sub, n)
	enqueued, pending, keys := ledgerFileCounts(t, filepath.Join(dir, "consumer.db"))
	t.Logf("%d events, %d copies published by the producer, %d kills: enqueued %d records (incl. sentinel), %d pending, %d ledger keys, %d extra publishes (at-least-once publish after a crash)",
		n, len(stream), kills, enqueued, pending, keys, extra)
	if enqueued != n+1 {
		t.Fatalf("outbox enqueued %d records for %d events + sentinel; want exactly %d", enqueued, n, n+1)
	}
	if keys != n+1 {
		t.Fatalf("ledger holds %d keys, want %d", keys, n+1)
	}
}
