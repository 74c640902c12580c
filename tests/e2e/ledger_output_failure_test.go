package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// outputFailureRun relays 150 events (each published twice) through
// reliable_mqtt_in → dedup_ledger → reliable_mqtt_out in direct mode (no
// outbox: a write fails when the destination does not answer) while the
// destination is a black hole for the middle 50. It returns the deliveries per
// event ID and the ledger's key count.
func outputFailureRun(t *testing.T, commitMode string) (map[string]int, int) {
	t.Helper()
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	dest := harness.NewProxy(t, m.Addr())
	sub := harness.Subscribe(t, m.URL(), "fail-out-"+commitMode, true, "events/out")
	clientID := "fail-consumer-" + commitMode
	ledgerSession(t, m.URL(), clientID)
	dir := t.TempDir()
	relay := ledgerRelay{inURL: m.URL(), outURL: dest.URL(), clientID: clientID, dbPath: "unused.db", ledgerPath: "ledger.db",
		withLedger: true, commitMode: commitMode, outbox: false}
	p := harness.RunPipeline(t, relay.yaml(), harness.ProcOptions{Dir: dir})

	publish := func(from, to int) {
		var batch [][]byte
		for i := from; i <= to; i++ {
			e := ledgerEvent(fmt.Sprintf("ev-%d", i))
			batch = append(batch, e, e) // every event twice
		}
		harness.Publish(t, m.URL(), "events/in", batch)
	}
	publish(1, 50)
	harness.Eventually(t, 30*time.Second, "the first 50 events", func() bool { return len(ledgerDeliveries(t, sub)) >= 50 })
	// A black hole, then a cut: writes time out with the connection still
	// up, so they fail back to the input and are redelivered (a link the
	// client knows is down would instead hold them in Benthos until the
	// reconnect: "not connected"); the cut drops what the stall held.
	dest.Stall()
	publish(51, 100)
	time.Sleep(2 * time.Second) // writes fail and are retried meanwhile
	dest.Cut()
	dest.Restore()
	// Wait for the output to reconnect, so that only the middle 50 meet
	// the outage (in immediate mode a later event meeting it is lost too).
	harness.Eventually(t, 30*time.Second, "the output to reconnect", func() bool {
		return strings.Count(p.Log(), "MQTT connected to ["+dest.URL()+"]") >= 2
	})
	publish(101, 150)
	ledgerSentinel(t, m.URL(), sub, "sentinel", 60*time.Second)
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	_, _, keys := ledgerFileCounts(t, dir+"/ledger.db")
	return ledgerDeliveries(t, sub), keys
}

// TestLedgerOutputFailureThenRecoveryDeliversEveryEvent: with commit: auto
// a failed write releases the key, so the retry passes and every event is
// delivered; the duplicates are dropped. The same run with commit:
// immediate (what Benthos's dedupe does) records keys before the write and
// loses the events whose write failed.
func TestLedgerOutputFailureThenRecoveryDeliversEveryEvent(t *testing.T) {
	t.Run("auto", func(t *testing.T) {
		got, keys := outputFailureRun(t, "auto")
		extra := 0
		for i := 1; i <= 150; i++ {
			c := got[fmt.Sprintf("ev-%d", i)]
			if c == 0 {
				t.Errorf("ev-%d lost", i)
			}
			extra += max(c-1, 0)
		}
		if keys != 151 {
			t.Errorf("ledger holds %d keys, want 151", keys)
		}
		// Direct mode publishes at least once: a write that timed out may
		// have reached the broker and is then published again.
		t.Logf("auto: 150/150 events delivered, %d extra publishes of 300 copies", extra)
	})
	t.Run("immediate", func(t *testing.T) {
		got, _ := outputFailureRun(t, "immediate")
		lost := 0
		for i := 1; i <= 150; i++ {
			if got[fmt.Sprintf("ev-%d", i)] == 0 {
				lost++
			}
		}
		if lost == 0 {
			t.Fatal("commit: immediate lost nothing; the documented trade-off did not show (was the destination really cut?)")
		}
		t.Logf("immediate: %d of 150 events lost (their write failed after the key was recorded)", lost)
	})
}
