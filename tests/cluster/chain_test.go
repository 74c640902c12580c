package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// chain is publisher → cluster → bridge → cluster → consumer, each a
// reliable-mqtt process, on one confirm mode. The consumer applies each
// event in one SQLite transaction with its ledger row: counter + 1 and a
// row in applied(seq), so the test sees which events arrived, not only
// how many.
type chain struct {
	name    string // "end_to_end" or "broker"
	n       int    // events the publisher generates
	dir     string
	cluster *harness.RabbitCluster
	// first node in each client's URL list: publisher, bridge input,
	// bridge output, consumer.
	pubNode, inNode, outNode, conNode int

	publisher, bridge, consumer *harness.Proc
}

func (c *chain) e2e() bool             { return c.name == "end_to_end" }
func (c *chain) topic(s string) string { return "cl/" + c.name + "/" + s }
func (c *chain) db() string            { return filepath.Join(c.dir, "consumer.db") }
func (c *chain) pubOutbox() string     { return filepath.Join(c.dir, "publisher-outbox.db") }
func (c *chain) bridgeOutbox() string {
	return filepath.Join(c.dir, "bridge-outbox.db")
}

func (c *chain) urls(first int) string {
	return `[ "` + strings.Join(c.cluster.URLs(first), `", "`) + `" ]`
}

// common settings: quick reconnects and resends, stats every 500 ms.
const clientTuning = `
    reconnect_backoff: { initial_interval: 100ms, max_interval: 1s }
    connect_timeout: 3s`

func (c *chain) publisherYAML(interval string) string {
	confirm := `
    confirm: broker
    envelope: delivery`
	topic := c.topic("ingress")
	if c.e2e() {
		confirm = fmt.Sprintf(`
    confirm: end_to_end
    data_topic: %s
    ack_topic: %s
    ack_timeout: 3s`, c.topic("ingress"), c.topic("acks-1"))
		topic = c.topic("events")
	}
	// The generator keeps ticking after n events (emitting nothing), so
	// the process stays up while its outbox drains.
	return fmt.Sprintf(`
http: { enabled: false }
logger: { level: INFO }
input:
  generate:
    interval: %s
    count: 0
    mapping: |
      let n = counter()
      root = if $n > %d { deleted() } else { {"seq": $n, "delta": 1} }
output:
  reliable_mqtt_out:
    urls: %s%s
    client_id: cl-%s-publisher
    topic: %s%s
    outbox: { path: %s }
    stats_interval: 500ms
`, interval, c.n, c.urls(c.pubNode), clientTuning, c.name, topic, confirm, c.pubOutbox())
}

// input is the head of a config whose input is the chain's role
// subscribed to topic; extra adds fields to reliable_mqtt_in.
func (c *chain) input(first int, role, topic, extra string) string {
	return fmt.Sprintf(`
http: { enabled: false }
logger: { level: INFO }
input:
  reliable_mqtt_in:
    urls: %s%s
    client_id: cl-%s-%s
    topics: [ %s ]
    qos: 1%s`, c.urls(first), clientTuning, c.name, role, topic, extra)
}

func (c *chain) bridgeYAML() string {
	in := `
    envelope: delivery`
	out := fmt.Sprintf(`
    topic: %s
    envelope: delivery
    confirm: broker`, c.topic("events"))
	if c.e2e() {
		in = fmt.Sprintf(`
    envelope: ingress
    ack_topic: %s`, c.topic("acks-1"))
		out = fmt.Sprintf(`
    topic: ${! meta("destination_topic") }
    confirm: end_to_end
    data_topic: %s
    ack_topic: %s
    ack_timeout: 3s`, c.topic("data-2"), c.topic("acks-2"))
	}
	return c.input(c.inNode, "bridge", c.topic("ingress"), in) + fmt.Sprintf(`
output:
  reliable_mqtt_out:
    urls: %s%s
    client_id: cl-%s-bridge-out
    event_id: ${! meta("event_id") }%s
    outbox: { path: %s }
    stats_interval: 500ms
`, c.urls(c.outNode), clientTuning, c.name, out, c.bridgeOutbox())
}

// consumerTopic is where the consumer's messages arrive: the bridge's
// destination topic, or with end_to_end the bridge's data topic.
func (c *chain) consumerTopic() string {
	if c.e2e() {
		return c.topic("data-2")
	}
	return c.topic("events")
}

func (c *chain) consumerYAML() string {
	in := `
    envelope: delivery`
	if c.e2e() {
		in = fmt.Sprintf(`
    envelope: ingress
    ack_topic: %s`, c.topic("acks-2"))
	}
	return c.input(c.conNode, "consumer", c.consumerTopic(), in) + fmt.Sprintf(`
pipeline:
  processors:
    - dedup_ledger:
        key: ${! meta("event_id") }
        on_duplicate: drop
        sql:
          driver: sqlite
          dsn: %q
          init_statements:
            - CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value BIGINT NOT NULL)
            - INSERT INTO counter (id, value) VALUES (1, 0) ON CONFLICT (id) DO NOTHING
            - CREATE TABLE IF NOT EXISTS applied (seq INTEGER NOT NULL)
          apply:
            - query: UPDATE counter SET value = value + ? WHERE id = 1
              args_mapping: root = [ this.delta ]
            - query: INSERT INTO applied (seq) VALUES (?)
              args_mapping: root = [ this.seq ]
output:
  reject_errored:
    drop: {}
`, c.db())
}

// applied reads the counter and the applied seqs (with repeats).
func (c *chain) applied(t *testing.T) (counter int, seqs []int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := sqlledger.Open(ctx, sqlledger.Config{Driver: "sqlite", DSN: c.db(), Table: "dedup_ledger"})
	if err != nil {
		t.Fatalf("%s chain: open %s: %v", c.name, c.db(), err)
	}
	defer st.Close()
	if err := st.DB().QueryRowContext(ctx, "SELECT value FROM counter WHERE id = 1").Scan(&counter); err != nil {
		if strings.Contains(err.Error(), "no such table") {
			return 0, nil // the consumer has not created it yet
		}
		t.Fatalf("%s chain: read counter: %v", c.name, err)
	}
	rows, err := st.DB().QueryContext(ctx, "SELECT seq FROM applied ORDER BY seq")
	if err != nil {
		t.Fatalf("%s chain: read applied: %v", c.name, err)
	}
	defer rows.Close()
	for rows.Next() {
		var s int
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return counter, seqs
}

var confirmedRE = regexp.MustCompile(`(\d+) confirmed in the last`)
var pendingRE = regexp.MustCompile(`; (\d+) pending \(`)

// confirmed sums the "confirmed" figures of a process's stats lines.
func confirmed(log string) int {
	total := 0
	for _, m := range confirmedRE.FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[1])
		total += n
	}
	return total
}

// pendingNow is the pending count of the newest stats line for the outbox
// at path, or -1 if there is none yet.
func pendingNow(log, path string) int {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.Contains(lines[i], "Outbox "+path+":") {
			continue
		}
		if m := pendingRE.FindStringSubmatch(lines[i]); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	return -1
}

// outboxPending opens an outbox file of a stopped process.
func outboxPending(t *testing.T, path string) int {
	t.Helper()
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatalf("open outbox %s: %v", path, err)
	}
	defer ob.Close()
	return int(ob.Stats().Pending)
}

// nodeOf returns the cluster node process p is connected to now (the
// first one found among its connections), or nil.
func nodeOf(t *testing.T, rc *harness.RabbitCluster, p *harness.Proc) *harness.RabbitNode {
	t.Helper()
	pid := p.Pid()
	if pid == 0 {
		return nil
	}
	ports, err := harness.RemotePorts(pid)
	if err != nil {
		t.Logf("connections of %s: %v", p, err)
		return nil
	}
	for _, port := range ports {
		if nd := rc.NodeByMQTTPort(port); nd != nil {
			return nd
		}
	}
	return nil
}
