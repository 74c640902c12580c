// Package damage opens damaged outbox and ledger files with the real
// binary: files the binary wrote, damaged the ways disks and people damage
// them (issue 8), each opened by a fresh process. For every variant the
// process either reads every record it still can or refuses with a clear
// error; it never crashes (exit code 2), never publishes a byte that is not
// a stored record, and never forgets a ledger key without an error.
package damage

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// runWait bounds each process run.
const runWait = 30 * time.Second

const records = 200

// pad makes records big enough that 200 of them span several leaf pages
// under a branch page.
var pad = strings.Repeat("x", 120)

// crashed matches what the Go runtime prints when a program dies.
var crashed = regexp.MustCompile(`(?m)^(panic: |fatal error: |\[signal |goroutine \d+ \[)`)

// checkNoCrash fails the test if the run ended in a Go crash.
func checkNoCrash(t *testing.T, p *harness.Proc) {
	t.Helper()
	if m := crashed.FindString(p.RunLog()); m != "" {
		t.Fatalf("the process crashed (%q in its output)", m)
	}
	if !p.Running() {
		if code, err := p.Wait(time.Second); err == nil && code == 2 {
			t.Fatal("the process exited with code 2")
		}
	}
}

// refusal returns the line in which the process refused the file, or "".
func refusal(log, path string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, path) && strings.Contains(l, "refusing") {
			return l
		}
	}
	return ""
}

func TestDamagedOutboxIsReadOrRefused(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.db")
	writeOutbox(t, base)
	stored := storedRecords(t, base, dir)
	if len(stored) != records {
		t.Fatalf("the binary stored %d records, want %d", len(stored), records)
	}
	baseBytes, _ := os.ReadFile(base)
	keys := map[string]bool{}
	for k := range stored {
		keys[k] = true
	}
	leaves := leavesHolding(baseBytes, keys)
	// A key can sit on more than one page: the live leaf and stale copies
	// that bbolt freed but did not overwrite.
	onPages := map[string][]int64{}
	for id, ks := range leafKeys(baseBytes) {
		for _, k := range ks {
			onPages[k] = append(onPages[k], id)
		}
	}
	payloads := map[string]bool{}
	for _, r := range stored {
		payloads[string(r.Payload)] = true
	}

	mosq := harness.StartMosquitto(t, harness.MosquittoOptions{})
	// Every variant with the start-up check (auto), and the ones a read can
	// meet without it (never): bbolt's own panics and faults while reading
	// must end in a refusal too. (A branch pointer without the check can
	// loop: see docs/guarantees.md.)
	type run struct {
		v      variant
		verify string
		seed   uint64
	}
	var runs []run
	for i, v := range variants() {
		runs = append(runs, run{v, "auto", uint64(i)})
		if strings.Contains(v.name, "leaf") {
			runs = append(runs, run{variant{v.name + " unverified", v.damage}, "never", uint64(i)})
		}
	}
	for i, r := range runs {
		v := r.v
		t.Run(v.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "outbox.db")
			touched, all := damaged(t, v, base, path, r.seed, leaves)
			sub := harness.Subscribe(t, mosq.URL(), fmt.Sprintf("damage-sub-%d", i), true, "damage/#")
			httpAddr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
			metricsURL := "http://" + httpAddr + "/metrics"
			p := harness.RunPipeline(t, drainConfig(mosq.URL(), path, httpAddr, r.verify), harness.ProcOptions{})
			done := harness.Poll(runWait, func() bool {
				log := p.RunLog()
				return refusal(log, path) != "" || strings.Contains(log, "; 0 pending (") || !p.Running()
			})
			checkNoCrash(t, p)
			if !done {
				t.Fatalf("within %s the process neither refused the file nor emptied the outbox", runWait)
			}
			// missing counts records on pages the damage did not touch that
			// the subscriber has not received.
			missing := func(got map[string]bool) int {
				n := 0
				for k, r := range stored {
					if !got[string(r.Payload)] && !slices.ContainsFunc(onPages[k], func(id int64) bool { return touched[id] }) {
						n++
					}
				}
				return n
			}
			received := func() map[string]bool {
				got := map[string]bool{}
				for _, m := range sub.Messages() {
					got[string(m.Payload)] = true
				}
				return got
			}
			// Confirmed by the broker is not yet delivered to the subscriber.
			if refusal(p.RunLog(), path) == "" && !strings.Contains(v.name, "meta") {
				harness.Poll(10*time.Second, func() bool { return missing(received()) == 0 })
			}
			time.Sleep(200 * time.Millisecond)
			// Whatever happened, nothing but stored records was published.
			for _, m := range sub.Messages() {
				if m.Topic != "damage/out" || !payloads[string(m.Payload)] {
					t.Errorf("published something that is not a stored record: topic %q, %d bytes %.80q", m.Topic, len(m.Payload), m.Payload)
				}
			}
			got := received()
			if line := refusal(p.RunLog(), path); line != "" {
				t.Logf("refused after publishing %d records: %s", len(got), line)
				return
			}
			if all {
				t.Fatal("the whole file is damaged, yet the process did not refuse it")
			}
			// Not refused: every record on a page the damage did not touch
			// was published. The meta variants lose the last commit, which
			// the process must have said out loud.
			lost := missing(got)
			if strings.Contains(v.name, "meta") {
				if !strings.Contains(p.RunLog(), "commit behind") {
					t.Error("a damaged newest meta page was not reported")
				}
				if lost > 0 {
					t.Logf("%d records of the lost last commit are missing, as reported", lost)
				}
				return
			}
			if lost > 0 {
				t.Fatalf("%d intact records were neither published nor was the file refused", lost)
			}
			// Each record moved aside is logged with its position and
			// counted in the metric.
			aside := len(movedAside.FindAllString(p.RunLog(), -1))
			t.Logf("published %d of %d records, %d moved aside as damaged", len(got), len(stored), aside)
			if !harness.Poll(10*time.Second, func() bool { return damagedGauge(metricsURL) == aside }) {
				t.Errorf("reliable_mqtt_out_damaged_records is %d, want %d", damagedGauge(metricsURL), aside)
			}
			// ... and shown by `reliable-mqtt outbox stat` once the process
			// let go of the file.
			if err := p.Stop(30 * time.Second); err != nil {
				t.Fatal(err)
			}
			if n := statDamaged(t, path); n != aside {
				t.Errorf("outbox stat shows %d damaged records, want %d", n, aside)
			}
		})
	}
}

// writeOutbox has the binary store records records with no broker to send
// them to, so they all stay in the outbox.
func writeOutbox(t *testing.T, path string) {
	t.Helper()
	noBroker := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	p := harness.RunPipeline(t, fmt.Sprintf(`
http: { enabled: false }
logger: { level: INFO }
input:
  generate:
    interval: ""
    count: %d
    mapping: 'root = {"n": counter(), "pad": %q}'
output:
  reliable_mqtt_out:
    urls: [ %q ]
    topic: damage/out
    event_id: 'evt-${! json("n") }'
    outbox: { path: %q }
`, records, pad, noBroker, path), harness.ProcOptions{})
	code, err := p.Wait(runWait)
	if err != nil || code != 0 {
		t.Fatalf("writing the outbox: exit %d, %v", code, err)
	}
}

// storedRecords reads what the binary stored, keyed by the record's bbolt
// key, from a copy (opening may add a client ID to a new file; not here).
func storedRecords(t *testing.T, path, dir string) map[string]outbox.Record {
	t.Helper()
	cp := filepath.Join(dir, "copy.db")
	b, _ := os.ReadFile(path)
	if err := os.WriteFile(cp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := outbox.Open(cp, outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	out := map[string]outbox.Record{}
	recs, err := o.Read(0, records*2)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		out[string(binary.BigEndian.AppendUint64(nil, r.Seq))] = r
	}
	return out
}

// movedAside matches the log line of a record moved aside.
var movedAside = regexp.MustCompile(`record seq \d+ \(\d+ bytes\) is damaged`)

// statDamaged runs `reliable-mqtt outbox stat --json` on path and returns
// its damaged count.
func statDamaged(t *testing.T, path string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, harness.Binary(t), "outbox", "stat", "--json", path).CombinedOutput()
	if err != nil {
		t.Fatalf("outbox stat %s: %v\n%s", path, err, out)
	}
	var st struct {
		Damaged *int `json:"damaged"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Damaged == nil {
		t.Fatalf("outbox stat --json printed no damaged count (%v):\n%s", err, out)
	}
	return *st.Damaged
}

// damagedGauge reads reliable_mqtt_out_damaged_records from the JSON
// metrics at url; -1 while it is not there.
func damagedGauge(url string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var stats map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&stats); err != nil {
		return -1
	}
	for k, v := range stats {
		if f, ok := v.(float64); ok && strings.HasPrefix(k, "reliable_mqtt_out_damaged_records") {
			return int(f)
		}
	}
	return -1
}

// drainConfig sends an existing outbox and writes nothing new.
func drainConfig(url, path, httpAddr, verify string) string {
	return harness.Drain{
		URL: url, Topic: "damage/unused", Outbox: path,
		Service:      fmt.Sprintf("http: { address: %q }\nmetrics: { json_api: {} }", httpAddr),
		OutboxFields: ", verify_on_start: " + verify,
		OutputFields: "    publish_timeout: 2s\n",
	}.YAML()
}

func TestDamagedLedgerForgetsNoKeyWithoutAnError(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.db")
	first := runLedger(t, base)
	if n := strings.Count(first.RunLog(), "PASSED evt-"); n != records {
		t.Fatalf("the first run applied %d keys, want %d", n, records)
	}
	baseBytes, _ := os.ReadFile(base)
	keys := map[string]bool{}
	for n := 1; n <= records; n++ {
		keys["\x00\x00"+fmt.Sprintf("evt-%d", n)] = true
	}
	leaves := leavesHolding(baseBytes, keys)
	if len(leaves) < 2 {
		t.Fatalf("the keys sit on %d leaf pages; the variants need several", len(leaves))
	}
	for i, v := range variants() {
		t.Run(v.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ledger.db")
			damaged(t, v, base, path, uint64(100+i), leaves)
			p := runLedger(t, path)
			checkNoCrash(t, p)
			log := p.RunLog()
			if line := refusal(log, path); line != "" {
				t.Logf("refused: %s", line)
				return
			}
			// Every key was applied before the damage: each copy must be a
			// duplicate (dropped) or fail with an error; one that passes is
			// a key the ledger forgot.
			if n := strings.Count(log, "PASSED evt-"); n > 0 {
				t.Fatalf("%d keys applied before were applied again without an error", n)
			}
			if n := strings.Count(log, "ERROR evt-"); n > 0 {
				t.Logf("%d keys failed with an error (damaged entries)", n)
			}
		})
	}
}

// runLedger feeds the keys evt-1..evt-200 through a bbolt dedup_ledger and
// prints PASSED or ERROR for each message that comes out; duplicates are
// dropped. The input ends after 200 messages, and so does the process.
func runLedger(t *testing.T, path string) *harness.Proc {
	t.Helper()
	p := harness.RunPipeline(t, fmt.Sprintf(`
http: { enabled: false }
logger: { level: INFO }
input:
  generate:
    interval: ""
    count: %d
    mapping: |
      let n = counter()
      root = {"n": $n}
      meta event_id = "evt-%%d".format($n)
pipeline:
  threads: 1
  processors:
    - dedup_ledger: { path: %q, commit: immediate }
    - mapping: 'root = if errored() { "ERROR " + @event_id } else { "PASSED " + @event_id }'
output:
  stdout: {}
`, records, path), harness.ProcOptions{})
	if !harness.Poll(runWait, func() bool { return !p.Running() }) {
		t.Fatalf("the ledger run did not end within %s", runWait)
	}
	return p
}
