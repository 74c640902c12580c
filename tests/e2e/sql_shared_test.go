package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// TestSQLSharedSubscriptionCrashLoopCountsExactly: two consumer processes
// share one subscription ($share/g/events/in) and one PostgreSQL ledger +
// counter. The publisher sends N distinct events, each one to three times
// (copies up to ~40 events apart, so copies often go to different
// consumers, sometimes at the same moment). Both consumers are SIGKILLed
// at random moments, four times each, and restarted.
//
// Asserted: the counter equals N exactly and the ledger holds N rows —
// every event applied once, whichever consumer got which copy, across
// commits interrupted by SIGKILL before the PUBACK. The log must also show
// copies recognised as duplicates (otherwise the test proved nothing).
func TestSQLSharedSubscriptionCrashLoopCountsExactly(t *testing.T) {
	const n, killsEach = 200, 4
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	pg := harness.StartPostgres(t)
	dsn := pg.NewDatabase(t)
	const filter = "$share/g/events/in"

	var cfgs []sqlCounter
	for i := range 2 {
		clientID := fmt.Sprintf("sql-shared-%d", i)
		// The sessions exist before the consumers first run, so the broker
		// queues their share meanwhile.
		harness.Subscribe(t, m.URL(), clientID, false, filter).Close()
		cfgs = append(cfgs, sqlCounter{url: m.URL(), clientID: clientID, topic: filter, driver: "postgres", dsn: dsn, slowAfter: "10ms"})
	}
	procs := runConsumers(t, cfgs)

	rng := testRand(t, 11)
	stream := dupStream(rng, n)
	published := publishStream(t, m.URL(), stream, 20, 50*time.Millisecond)

	// Kill the two consumers alternately, each killsEach times.
	killWhilePublishing(t, rng, published, 2*killsEach, func(k int) *harness.Proc { return procs[k%2] })

	harness.Eventually(t, 60*time.Second, fmt.Sprintf("all %d events applied", n), func() bool {
		c, _ := sqlState(t, "postgres", dsn)
		return c >= n
	})
	// Let stragglers (redeliveries after the last kill) arrive, then stop
	// gracefully so everything in flight finishes.
	time.Sleep(2 * time.Second)
	for _, p := range procs {
		if err := p.Stop(15 * time.Second); err != nil {
			t.Error(err)
		}
	}
	counter, rows := sqlState(t, "postgres", dsn)
	var deliveries, dups, redelivered, window int
	for _, p := range procs {
		log := p.Log()
		deliveries += strings.Count(log, "delivery event=")
		dups += strings.Count(log, " duplicate=true")
		redelivered += strings.Count(log, "delivery event=") - strings.Count(log, " dup=false")
		// A broker redelivery the ledger recognised: mostly seed 001's
		// window (this copy committed, then the consumer was killed before
		// its PUBACK); it can also be a copy the other consumer applied.
		window += strings.Count(log, "mqtt_dup=true duplicate=true")
	}
	t.Logf("%d events, %d copies published, %d kills: counter=%d ledger_rows=%d; consumers logged %d deliveries, %d recognised duplicates, %d broker redeliveries (DUP), %d broker redeliveries recognised as duplicates",
		n, len(stream), 2*killsEach, counter, rows, deliveries, dups, redelivered, window)
	if counter != n || rows != n {
		t.Fatalf("counter = %d, ledger rows = %d; want exactly %d each", counter, rows, n)
	}
	if dups == 0 {
		t.Fatal("no injected duplicate was recognised: the ledger was not exercised")
	}
	if window == 0 {
		// Random kills usually land between a commit and its PUBACK (the
		// 10 ms sleep widens that gap), but not always; sql_seed_test.go
		// hits that window deterministically with a failpoint.
		t.Log("no kill landed between a commit and its PUBACK in this run")
	}
}
