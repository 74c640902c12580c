package rollback

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.golang/paho"
	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

const (
	records = 20
	topic   = "rollback/readings"
	runWait = 60 * time.Second
)

// writeConfig stores `records` MQTT 5 messages with user properties (record
// version 3 in this build) while no broker listens, and exits.
func writeConfig(noBroker, path string) string {
	return fmt.Sprintf(`
http: { enabled: false }
logger: { level: INFO }
input:
  generate:
    interval: ""
    count: %d
    mapping: |
      let n = counter()
      root = {"n": $n, "reading": "value %%d".format($n)}
output:
  reliable_mqtt_out:
    urls: [ %q ]
    protocol_version: "5"
    topic: %s
    event_id: 'rb-${! json("n") }'
    user_properties:
      site: plant-7
      reading: '${! json("n") }'
    outbox: { path: %q }
`, records, noBroker, topic, path)
}

// drainConfig sends an existing outbox and writes nothing new.
func drainConfig(url, path string) string {
	return harness.Drain{
		URL: url, Topic: topic, Outbox: path,
		Service:      "http: { enabled: false }",
		OutputFields: "    protocol_version: \"5\"\n",
	}.YAML()
}

// write runs bin on writeConfig until it exits.
func write(t *testing.T, bin, path string) {
	t.Helper()
	noBroker := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	p := harness.RunPipeline(t, writeConfig(noBroker, path), harness.ProcOptions{Binary: bin})
	if code, err := p.Wait(runWait); err != nil || code != 0 {
		t.Fatalf("%s writing the outbox: exit %d, %v\n%s", bin, code, err, p.Log())
	}
}

// cli runs a reliable-mqtt command and returns its output.
func cli(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := run(t, time.Minute, "", bin, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
	}
	return out
}

// stored is a record as `outbox list --json` shows it.
type stored struct {
	Seq        uint64          `json:"seq"`
	EventID    string          `json:"event_id"`
	Topic      string          `json:"topic"`
	Properties json.RawMessage `json:"mqtt5_properties"`
	SetAside   string          `json:"set_aside"`
}

// export returns the pending records with their payloads, as this build
// reads them.
func export(t *testing.T, path string) (recs []stored, payloads map[string][]byte) {
	t.Helper()
	payloads = map[string][]byte{}
	for _, l := range strings.Split(strings.TrimSpace(cli(t, harness.Binary(t), "outbox", "export", path)), "\n") {
		var r struct {
			stored
			Payload *string `json:"payload"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.Payload == nil {
			t.Fatalf("export line %q: %v", l, err)
		}
		recs = append(recs, r.stored)
		payloads[r.EventID] = []byte(*r.Payload)
	}
	return recs, payloads
}

// recordVersions reads the version byte of every pending and set-aside
// record straight from the file.
func recordVersions(t *testing.T, path string) (pending, aside []byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		for name, into := range map[string]*[]byte{"outbox/records": &pending, "outbox/damaged": &aside} {
			if b := tx.Bucket([]byte(name)); b != nil {
				_ = b.ForEach(func(_, v []byte) error { *into = append(*into, v[0]); return nil })
			}
		}
		return nil
	})
	return pending, aside
}

// received is one PUBLISH as the MQTT 5 subscriber saw it.
type received struct {
	payload []byte
	user    map[string]string
}

// subscriber is an MQTT 5 client (clean start, QoS 1) that records every
// message on topic with its user properties.
type subscriber struct {
	mu   sync.Mutex
	msgs []received
}

func subscribe(t *testing.T, addr string) *subscriber {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &subscriber{}
	c := paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			r := received{payload: append([]byte(nil), pr.Packet.Payload...), user: map[string]string{}}
			if p := pr.Packet.Properties; p != nil {
				for _, u := range p.User {
					r.user[u.Key] = u.Value
				}
			}
			s.mu.Lock()
			s.msgs = append(s.msgs, r)
			s.mu.Unlock()
			return true, nil
		}},
	})
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: "rollback-sub", CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *subscriber) messages() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

// drain runs this build on the outbox until the subscriber has `records`
// messages and the outbox is empty, and checks that they are the stored
// records exactly, in their order: payload and user properties.
func drain(t *testing.T, mosq *harness.Mosquitto, sub *subscriber, path string, want []stored, payloads map[string][]byte) {
	t.Helper()
	p := harness.RunPipeline(t, drainConfig(mosq.URL(), path), harness.ProcOptions{})
	harness.Eventually(t, runWait, fmt.Sprintf("%d messages delivered", records), func() bool { return len(sub.messages()) >= records })
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	got := sub.messages()
	if len(got) != records {
		t.Fatalf("the subscriber got %d messages, want %d", len(got), records)
	}
	for i, r := range want {
		var props struct {
			User [][2]string `json:"user"`
		}
		if err := json.Unmarshal(r.Properties, &props); err != nil {
			t.Fatalf("seq %d: stored properties %s: %v", r.Seq, r.Properties, err)
		}
		wantUser := map[string]string{}
		for _, kv := range props.User {
			wantUser[kv[0]] = kv[1]
		}
		n := strings.TrimPrefix(r.EventID, "rb-")
		if wantUser["site"] != "plant-7" || wantUser["reading"] != n {
			t.Fatalf("seq %d (%s) was stored with user properties %v", r.Seq, r.EventID, wantUser)
		}
		if !bytes.Equal(got[i].payload, payloads[r.EventID]) || !maps(got[i].user, wantUser) {
			t.Errorf("message %d: payload %q, user properties %v; stored as seq %d: %q, %v", i, got[i].payload, got[i].user, r.Seq, payloads[r.EventID], wantUser)
		}
		if !strings.Contains(string(payloads[r.EventID]), fmt.Sprintf("value %s", n)) {
			t.Errorf("seq %d (%s): payload %q is not the reading written", r.Seq, r.EventID, payloads[r.EventID])
		}
	}
	if st := cli(t, harness.Binary(t), "outbox", "stat", path); !regexp.MustCompile(`pending:\s+0 records`).MatchString(st) {
		t.Fatalf("the outbox is not empty after the drain:\n%s", st)
	}
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// The field case of issue 32: records with MQTT 5 user properties written
// by this build while the broker is away; the previous release, started on
// the same file, sets every one aside as damaged; rolled forward, `outbox
// stat` does not call them checksum failures, `outbox restore` puts them
// back, and all are delivered exactly as written.
func TestRolledBackReleaseSetsAsideAndRestoreDeliversAll(t *testing.T) {
	prev := previousRelease(t)
	path := filepath.Join(t.TempDir(), "outbox.db")
	write(t, harness.Binary(t), path)
	if pending, _ := recordVersions(t, path); len(pending) != records || bytes.Count(pending, []byte{3}) != records {
		t.Fatalf("this build stored record versions %v, want %d of version 3", pending, records)
	}
	want, payloads := export(t, path)

	mosq := harness.StartMosquitto(t, harness.MosquittoOptions{})
	sub := subscribe(t, mosq.Addr())
	old := harness.RunPipeline(t, drainConfig(mosq.URL(), path), harness.ProcOptions{Binary: prev})
	movedAside := regexp.MustCompile(`record seq \d+ \(\d+ bytes\) is damaged \(unknown record version 3\)`)
	harness.Eventually(t, runWait, "the previous release sets every record aside", func() bool {
		return len(movedAside.FindAllString(old.Log(), -1)) >= records
	})
	if err := old.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := len(sub.messages()); n != 0 {
		t.Fatalf("the previous release published %d messages", n)
	}
	if pending, aside := recordVersions(t, path); len(pending) != 0 || len(aside) != records {
		t.Fatalf("after the previous release: %d pending, %d set aside; want 0 and %d", len(pending), len(aside), records)
	}

	st := cli(t, harness.Binary(t), "outbox", "stat", path)
	if !strings.Contains(st, fmt.Sprintf("%d records, never published: %d pass their checksum in a format this build reads", records, records)) ||
		!strings.Contains(st, " 0 fail their checksum") || strings.Contains(st, "failed their checksum") {
		t.Fatalf("outbox stat before the restore:\n%s", st)
	}
	out := cli(t, harness.Binary(t), "outbox", "restore", path)
	if !strings.Contains(out, fmt.Sprintf("restored %d records", records)) || !strings.Contains(out, "still set aside: 0 records") {
		t.Fatalf("outbox restore:\n%s", out)
	}
	restored, _ := export(t, path)
	if fmt.Sprint(restored) != fmt.Sprint(want) {
		t.Fatalf("restored records %v\nwant %v", restored, want)
	}
	drain(t, mosq, sub, path, want, payloads)
}

// New reads old: a file the previous release wrote (user properties in its
// own encoding) is read and delivered whole by this build.
func TestThisBuildReadsAndDeliversAFileOfThePreviousRelease(t *testing.T) {
	prev := previousRelease(t)
	path := filepath.Join(t.TempDir(), "outbox.db")
	write(t, prev, path)
	if pending, _ := recordVersions(t, path); len(pending) != records || bytes.Count(pending, []byte{2}) != records {
		t.Fatalf("the previous release stored record versions %v, want %d of version 2", pending, records)
	}
	if st := cli(t, harness.Binary(t), "outbox", "stat", path); !strings.Contains(st, fmt.Sprintf("%d records pass their checksums", records)) {
		t.Fatalf("outbox stat of the previous release's file:\n%s", st)
	}
	want, payloads := export(t, path)
	mosq := harness.StartMosquitto(t, harness.MosquittoOptions{})
	drain(t, mosq, subscribe(t, mosq.Addr()), path, want, payloads)
}
