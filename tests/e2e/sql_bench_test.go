package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// sqlBenchMessages is how many events each b.N round pushes through.
const sqlBenchMessages = 4000

// BenchmarkSQLLedgerPipeline measures messages/s through the real binary:
// reliable_mqtt_in (QoS 1, persistent session, manual ack) → [dedup_ledger
// with the seed's counter in sql.apply] → drop, for no ledger, SQLite and
// PostgreSQL, in one run and with the same broker settings.
//
// The events are queued at Mosquitto for the consumer's session before the
// consumer starts, so the publisher's speed does not limit the figure. The
// rate is counted from the first message out to the last (output_sent from
// the consumer's /metrics), which leaves out process start-up.
//
//	go test ./tests/e2e/ -run '^$' -bench BenchmarkSQLLedgerPipeline -benchtime 1x
func BenchmarkSQLLedgerPipeline(b *testing.B) {
	pg := harness.StartPostgres(b)
	b.Run("no-ledger", func(b *testing.B) { sqlBench(b, "", "") })
	b.Run("sqlite", func(b *testing.B) { sqlBench(b, "sqlite", filepath.Join(b.TempDir(), "counter.db")) })
	b.Run("postgres", func(b *testing.B) { sqlBench(b, "postgres", pg.NewDatabase(b)) })
	// One connection: one transaction at a time, with bigger groups. On a
	// single hot row (the counter) parallel transactions only queue for
	// its row lock.
	b.Run("postgres-1conn", func(b *testing.B) { sqlBench(b, "postgres+1conn", pg.NewDatabase(b)) })
}

func sqlBench(b *testing.B, driver, dsn string) {
	conns := 0
	if d, ok := strings.CutSuffix(driver, "+1conn"); ok {
		driver, conns = d, 1
	}
	m := harness.StartMosquitto(b, harness.MosquittoOptions{MaxInflight: 100})
	clientID := fmt.Sprintf("sql-bench-%s-%d", driver, time.Now().UnixNano())
	harness.Subscribe(b, m.URL(), clientID, false, "events/in").Close()
	port := harness.FreePort(b)
	yaml := sqlBenchYAML(m.URL(), clientID, port, driver, dsn, conns)

	var rates []float64
	for round := range b.N {
		n := sqlBenchMessages
		events := make([][]byte, n)
		for i := range events {
			events[i] = ledgerEvent(fmt.Sprintf("r%d-ev-%d", round, i))
		}
		for i := 0; i < n; i += 500 {
			harness.Publish(b, m.URL(), "events/in", events[i:min(i+500, n)])
		}
		p := harness.RunPipeline(b, yaml, harness.ProcOptions{})
		var sent, first int
		var t0 time.Time
		if !harness.Poll(120*time.Second, func() bool {
			sent = outputSent(port)
			if sent > 0 && t0.IsZero() {
				first, t0 = sent, time.Now()
			}
			return sent >= n
		}) {
			b.Fatalf("only %d of %d messages out after 120s\n%s", sent, n, p.Log())
		}
		rates = append(rates, float64(sent-first)/time.Since(t0).Seconds())
		if err := p.Stop(15 * time.Second); err != nil {
			b.Fatal(err)
		}
		if driver != "" {
			if c, rows := sqlState(b, driver, dsn); c != int64((round+1)*n) || rows != int64((round+1)*n) {
				b.Fatalf("counter %d, ledger rows %d; want %d", c, rows, (round+1)*n)
			}
		}
	}
	var sum float64
	for _, r := range rates {
		sum += r
	}
	b.ReportMetric(sum/float64(len(rates)), "msgs/s")
	b.ReportMetric(0, "ns/op")
}

func sqlBenchYAML(url, clientID string, port int, driver, dsn string, conns int) string {
	ledger := ""
	if driver != "" {
		ph := "?"
		if driver == "postgres" {
			ph = "$1"
		}
		ledger = fmt.Sprintf(`
    - dedup_ledger:
        key: ${! json("event_id") }
        namespace: ${! json("producer") }
        sql:
          driver: %s
          dsn: %q
          max_open_conns: %d
          init_statements:
            - CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value BIGINT NOT NULL)
            - INSERT INTO counter (id, value) VALUES (1, 0) ON CONFLICT (id) DO NOTHING
          apply:
            - query: UPDATE counter SET value = value + %s WHERE id = 1
              args_mapping: root = [ this.delta ]
`, driver, dsn, conns, ph)
	}
	return fmt.Sprintf(`
http:
  enabled: true
  address: 127.0.0.1:%d
metrics:
  json_api: {}
logger:
  level: WARN
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: %s
    clean_session: false
    topics: [ "events/in" ]
    qos: 1
pipeline:
  threads: 64
  processors:
    - mapping: root = this%s
output:
  reject_errored:
    drop: {}
`, port, url, clientID, ledger)
}

// outputSent reads output_sent from the consumer's JSON metrics; 0
// while it is not up.
func outputSent(port int) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var stats map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&stats); err != nil {
		return 0
	}
	// Nested outputs report their own output_sent; the largest is the
	// root's count.
	total := 0
	for k, v := range stats {
		if f, ok := v.(float64); ok && strings.HasPrefix(k, "output_sent{") {
			total = max(total, int(f))
		}
	}
	return total
}
