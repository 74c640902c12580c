package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
)

// sqlCounter describes the seed-001 consumer as a pipeline:
// reliable_mqtt_in (persistent session, QoS 1) → log → dedup_ledger with
// the counter in sql.apply → log → reject_errored(drop).
//
// The two log processors make the run observable without touching the
// database: "delivery event=… dup=…" shows each delivery and its MQTT DUP
// flag; "after event=… duplicate=…" shows what left the ledger (with
// on_duplicate: flag, a recognised redelivery passes with duplicate=true).
// reject_errored matters: a message whose transaction failed must be
// nacked (and redelivered), where a bare drop would acknowledge it.
type sqlCounter struct {
	url, clientID string
	topic         string // subscription filter; "" = events/in
	driver        string // sqlite | postgres
	dsn           string
	blind         bool // key = a fresh UUID per delivery: the ledger sees every copy as new
	noInit        bool // do not create the counter table (the test does, later)
	// slowAfter, if set, is a sleep after dedup_ledger: the effect is
	// committed, the message not yet acknowledged — it widens the crash
	// window a random kill can hit, as a slow output would.
	slowAfter string
	// quiet leaves out the two log processors (a measurement should not
	// pay for two log lines per message).
	quiet bool
	// threads, if set, is pipeline.threads: how many messages the ledger
	// can group into one transaction.
	threads int
	// conns, if set, is sql.max_open_conns: how many transactions run at once.
	conns int
	// bin, if set, is the binary to run (a build of another commit).
	bin string
	// env, if set, is NAME=VALUE added to the consumer's environment.
	env string
	// debugPort, if set, serves Benthos's HTTP API with /debug/pprof there.
	debugPort int
}

func (c sqlCounter) yaml() string {
	topic := c.topic
	if topic == "" {
		topic = "events/in"
	}
	ph := "?"
	if c.driver == "postgres" {
		ph = "$1"
	}
	key := `${! json("event_id") }`
	if c.blind {
		key = `${! uuid_v4() }`
	}
	init := `
          init_statements:
            - CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value BIGINT NOT NULL)
            - INSERT INTO counter (id, value) VALUES (1, 0) ON CONFLICT (id) DO NOTHING`
	if c.noInit {
		init = ""
	}
	before := `
    - log:
        level: INFO
        message: 'delivery event=${! json("event_id") } dup=${! meta("mqtt_duplicate") }'`
	after := `
    - log:
        level: INFO
        message: 'after event=${! json("event_id") } mqtt_dup=${! meta("mqtt_duplicate") } duplicate=${! meta("dedup_duplicate") } error=${! error() }'`
	if c.quiet {
		before, after = "", ""
	}
	httpConf := "  enabled: false"
	if c.debugPort != 0 {
		httpConf = fmt.Sprintf("  enabled: true\n  address: 127.0.0.1:%d\n  debug_endpoints: true", c.debugPort)
	}
	return fmt.Sprintf(`
http:
%s
logger:
  level: INFO
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
pipeline:%s
  processors:%s
    - dedup_ledger:
        key: '%s'
        namespace: ${! json("producer") }
        on_duplicate: flag
        sql:
          driver: %s
          dsn: %q%s%s
          apply:
            - query: UPDATE counter SET value = value + %s WHERE id = 1
              args_mapping: root = [ this.delta ]%s
%soutput:
  reject_errored:
    drop: {}
`, httpConf, c.url, c.clientID, topic, c.threadsConf(), before, key, c.driver, c.dsn, c.connsConf(), init, ph, after, c.slow())
}

func (c sqlCounter) connsConf() string {
	if c.conns == 0 {
		return ""
	}
	return fmt.Sprintf("\n          max_open_conns: %d", c.conns)
}

func (c sqlCounter) threadsConf() string {
	if c.threads == 0 {
		return ""
	}
	return fmt.Sprintf("\n  threads: %d", c.threads)
}

func (c sqlCounter) slow() string {
	if c.slowAfter == "" {
		return ""
	}
	return fmt.Sprintf("    - sleep:\n        duration: %s\n", c.slowAfter)
}

// sqlState reads the counter and the number of ledger rows. For SQLite
// the reader opens the file with a busy timeout, so it may read while the
// consumer runs.
func sqlState(t testing.TB, driver, dsn string) (counter, rows int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := sqlledger.Open(ctx, sqlledger.Config{Driver: sqlledger.Driver(driver), DSN: dsn, Table: "dedup_ledger"})
	if err != nil {
		t.Fatalf("open %s database: %v", driver, err)
	}
	defer st.Close()
	if rows, err = st.Count(ctx); err != nil {
		t.Fatal(err)
	}
	err = st.DB().QueryRowContext(ctx, "SELECT value FROM counter WHERE id = 1").Scan(&counter)
	if err != nil && !strings.Contains(err.Error(), "no such table") && !strings.Contains(err.Error(), "does not exist") {
		t.Fatal(err)
	}
	return counter, rows
}
