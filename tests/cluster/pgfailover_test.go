package cluster

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// TestConsumerGroupCountsExactlyAcrossALedgerFailover runs a consumer
// group (three reliable-mqtt consumers on $share/g/events/in, Mosquitto)
// whose dedup_ledger and counter live in PostgreSQL 15 run as a durable
// primary with a synchronous pg_basebackup -R standby, reached through the
// multi-host DSN with target_session_attrs=read-write. Events are published
// one to three times each.
//
// "failover": at about a third of the stream the primary is SIGKILLed;
// at once a consumer is SIGKILLed and restarted while no server is
// read-write (it must wait, not exit, its /ready must not be 200 and its
// dedup_ledger_sql_available gauge must read 0); the
// standby is promoted three seconds later; then another consumer is
// SIGKILLed and restarted. "no kill": the same without any kill.
//
// Asserted in both: the counter and the ledger row count on the server
// that is primary at the end equal the number of distinct events, no
// consumer exited on its own, and every consumer's
// dedup_ledger_sql_available reads 1 at the end. docs/scaling.md reports what it logs.
func TestConsumerGroupCountsExactlyAcrossALedgerFailover(t *testing.T) {
	for _, failover := range []bool{false, true} {
		name := "no kill"
		if failover {
			name = "failover"
		}
		t.Run(name, func(t *testing.T) { runLedgerFailover(t, failover) })
	}
}

func runLedgerFailover(t *testing.T, failover bool) {
	const n, consumers = 800, 3
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 22))
	pp := harness.StartPostgresPair(t)
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	const filter = "$share/g/events/in"
	procs := make([]*harness.Proc, consumers)
	ports := make([]int, consumers)
	for i := range consumers {
		id := fmt.Sprintf("pgf-%d", i)
		harness.Subscribe(t, m.URL(), id, false, filter).Close()
		ports[i] = harness.FreePort(t)
		procs[i] = harness.RunPipeline(t, groupConsumerYAML(m.URL(), id, filter, pp.DSN(), ports[i]), harness.ProcOptions{})
		// The first one alone creates the tables (see docs/scaling.md).
		if i == 0 && !procs[0].WaitForLog("Output type drop is now active", 60*time.Second) {
			t.Fatal("the first consumer did not start its pipeline within 60s")
		}
	}
	db, err := sql.Open("pgx", pp.DSN()+"&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	applied := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var v int
		if db.QueryRowContext(ctx, `SELECT value FROM counter WHERE id = 1`).Scan(&v) != nil {
			return -1 // no read-write server now
		}
		return v
	}

	stream := harness.DupStream(rng, n)
	published := harness.PublishStream(t, m.URL(), stream, 20, 40*time.Millisecond)
	began := time.Now()
	if failover {
		harness.Eventually(t, 90*time.Second, "a third of the events applied", func() bool { return applied() >= n/3 })
		at := applied()
		pp.Primary.Kill()
		killed := time.Now()
		t.Logf("primary SIGKILLed at %d of %d events applied", at, n)
		// A consumer that starts while no server is read-write waits.
		late := procs[1]
		late.Kill()
		late.Restart()
		if !late.WaitForLog("waiting for a read-write server", 30*time.Second) {
			t.Fatal("the consumer restarted during the outage did not log that it waits for a read-write server")
		}
		if code := readyStatus(ports[1]); code == http.StatusOK {
			t.Fatal("/ready of the consumer waiting for a read-write server answered 200")
		}
		if v, ok := metric(ports[1], "dedup_ledger_sql_available"); !ok || v != 0 {
			t.Fatalf("dedup_ledger_sql_available = %v (served: %v) while the consumer waits for a read-write server, want 0", v, ok)
		}
		time.Sleep(3 * time.Second)
		if !late.Running() {
			t.Fatalf("the consumer restarted during the outage exited:\n%s", tail(late.RunLog(), 20))
		}
		pp.Standby.Promote()
		t.Logf("standby promoted %s after the kill", time.Since(killed).Round(100*time.Millisecond))
		harness.Eventually(t, 60*time.Second, "the waiting consumer's /ready to answer 200", func() bool {
			return readyStatus(ports[1]) == http.StatusOK
		})
		harness.Eventually(t, 60*time.Second, "events applied on the promoted server", func() bool { return applied() > at })
		procs[2].Kill()
		procs[2].Restart()
	}
	select {
	case <-published:
	case <-time.After(90 * time.Second):
		t.Fatal("the publisher did not finish within 90s")
	}
	harness.Eventually(t, 90*time.Second, fmt.Sprintf("all %d events applied", n), func() bool { return applied() >= n })
	time.Sleep(2 * time.Second) // redeliveries after the last kill arrive
	t.Logf("%d messages (%d distinct events) applied in %s", len(stream), n, time.Since(began).Round(time.Second))
	var waits, back, failed int
	for _, p := range procs {
		waits += strings.Count(p.Log(), "has no read-write server answering")
		back += strings.Count(p.Log(), "answers again")
		failed += strings.Count(p.Log(), "the apply transaction of key")
	}
	t.Logf("consumer logs: %d \"no read-write server\" lines, %d \"answers again\", %d messages failed (nacked)", waits, back, failed)
	for i := range procs {
		avail, _ := metric(ports[i], "dedup_ledger_sql_available")
		retries, _ := metric(ports[i], "dedup_ledger_sql_retries")
		t.Logf("consumer %d: dedup_ledger_sql_available %v, dedup_ledger_sql_retries %v", i, avail, retries)
		if avail != 1 {
			t.Errorf("consumer %d: dedup_ledger_sql_available = %v at the end, want 1", i, avail)
		}
	}
	for i, p := range procs {
		if !p.Running() {
			t.Errorf("consumer %d exited on its own:\n%s", i, tail(p.RunLog(), 20))
		}
		if err := p.Stop(15 * time.Second); err != nil {
			t.Error(err)
		}
	}
	// Read the final primary directly: the promoted standby, or the primary.
	final := pp.Primary
	if failover {
		final = pp.Standby
	}
	fdb, err := sql.Open("pgx", final.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer fdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var counter, rows int
	var recovery bool
	if err := fdb.QueryRowContext(ctx, `SELECT (SELECT value FROM counter WHERE id = 1), (SELECT count(*) FROM dedup_ledger), pg_is_in_recovery()`).Scan(&counter, &rows, &recovery); err != nil {
		t.Fatal(err)
	}
	if recovery {
		t.Fatal("the server read at the end is still a standby")
	}
	if counter != n || rows != n {
		t.Fatalf("counter = %d, ledger rows = %d; want exactly %d each", counter, rows, n)
	}
}

// groupConsumerYAML is a group member: reliable_mqtt_in → dedup_ledger
// (counter in sql.apply, PostgreSQL) → reject_errored(drop), with the HTTP
// server on port for /ready.
func groupConsumerYAML(url, clientID, filter, dsn string, port int) string {
	return fmt.Sprintf(`
http:
  enabled: true
  address: 127.0.0.1:%d
logger:
  level: INFO
metrics:
  prometheus: {}
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: %s
    clean_session: false
    topics: [ %q ]
    qos: 1
    retry_backoff:
      initial_interval: 100ms
      max_interval: 500ms
pipeline:
  processors:
    - dedup_ledger:
        key: '${! json("event_id") }'
        namespace: ${! json("producer") }
        on_duplicate: flag
        sql:
          driver: postgres
          dsn: %q
          connect_timeout: 2s
          init_statements:
            - CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value BIGINT NOT NULL)
            - INSERT INTO counter (id, value) VALUES (1, 0) ON CONFLICT (id) DO NOTHING
          apply:
            - query: UPDATE counter SET value = value + $1 WHERE id = 1
              args_mapping: root = [ this.delta ]
output:
  reject_errored:
    drop: {}
`, port, url, clientID, filter, dsn)
}

// metric is the sum of a metric's samples on port's /metrics.
func metric(port int, name string) (float64, bool) {
	fams, err := harness.ScrapeMetrics(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return 0, false
	}
	return harness.MetricSum(fams, name, nil)
}

// readyStatus is the HTTP status of /ready on port, 0 if nothing answers.
func readyStatus(port int) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", port))
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
