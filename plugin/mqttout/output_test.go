package mqttout_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/mqttout"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

const waitLong = 60 * time.Second

// unreachable is a broker URL nothing listens on: the outbox must accept
// writes anyway (store and forward).
const unreachable = "tcp://127.0.0.1:1"

// brokers runs fn against mosquitto and against the embedded broker.
func brokers(t *testing.T, fn func(t *testing.T, clientURL, outputURL string)) {
	t.Run("mosquitto", func(t *testing.T) {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{MaxInflight: 1000})
		fn(t, m.URL(), m.URL())
	})
	t.Run("embedded", func(t *testing.T) {
		port := harness.FreePort(t)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		outputURL := "embedded://?dir=" + filepath.Join(t.TempDir(), "broker") + "&listen=" + addr
		// The output starts the broker; the test's clients dial its listener,
		// so start the pipeline first (see the callers).
		fn(t, "tcp://"+addr, outputURL)
	})
}

// outputConf renders a reliable_mqtt_out config. fields override or add
// top-level fields, as YAML values ("window", "1", "outbox", "{path: x}").
func outputConf(url, outboxPath string, fields ...string) string {
	conf := map[string]string{
		"urls":              fmt.Sprintf("[ %q ]", url),
		"topic":             `'test/${! meta("n").or("") }'`,
		"event_id":          `'${! meta("id").or("") }'`,
		"stats_interval":    "100ms",
		"outbox":            fmt.Sprintf("{ path: %q }", outboxPath),
		"publish_timeout":   "5s",
		"ack_timeout":       "5s",
		"reconnect_backoff": "{ initial_interval: 50ms, max_interval: 500ms }",
		"retry_backoff":     "{ initial_interval: 50ms, max_interval: 500ms }",
	}
	for i := 0; i+1 < len(fields); i += 2 {
		conf[fields[i]] = fields[i+1]
	}
	keys := make([]string, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("reliable_mqtt_out:\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s: %s\n", k, conf[k])
	}
	return b.String()
}

// waitDrained waits until the output's stats line reports an empty outbox.
func waitDrained(t *testing.T, p *streamtest.Stream) {
	t.Helper()
	harness.Eventually(t, waitLong, "the outbox to drain", func() bool {
		lines := strings.Split(p.Logs.String(), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if strings.Contains(lines[i], " pending (") {
				return strings.Contains(lines[i], "; 0 pending (0 bytes)")
			}
		}
		return false
	})
}

func TestPublishesEveryMessageInFIFOOrderAndEmptiesTheOutbox(t *testing.T) {
	for _, window := range []int{1, 64} {
		t.Run(fmt.Sprintf("window=%d", window), func(t *testing.T) {
			brokers(t, func(t *testing.T, clientURL, outputURL string) {
				const n = 300
				path := filepath.Join(t.TempDir(), "outbox.db")
				p := streamtest.Start(t, outputConf(outputURL, path, "window", strconv.Itoa(window), "topic", "test/fifo"))
				// Let the output (and an embedded broker) start before subscribing.
				if err := p.Write(10*time.Second, "0", "n", "x"); err != nil {
					t.Fatal(err)
				}
				sub := harness.Subscribe(t, clientURL, "fifo-sub", true, "test/fifo")
				for i := 1; i <= n; i++ {
					if err := p.Write(10*time.Second, strconv.Itoa(i)); err != nil {
						t.Fatalf("write %d: %v", i, err)
					}
				}
				harness.Eventually(t, waitLong, "every message at the subscriber", func() bool { return lastIs(sub, strconv.Itoa(n)) })
				var got []int
				seen := map[int]bool{}
				for _, m := range sub.Messages() {
					v, err := strconv.Atoi(string(m.Payload))
					if err != nil {
						t.Fatalf("unexpected payload %q", m.Payload)
					}
					if !seen[v] {
						seen[v] = true
						got = append(got, v)
					}
				}
				// Message 0 may predate the subscription; 1..n must all be there in order.
				if got[0] == 0 {
					got = got[1:]
				}
				if len(got) != n {
					t.Fatalf("received %d distinct messages, want %d", len(got), n)
				}
				for i, v := range got {
					if v != i+1 {
						t.Fatalf("first deliveries out of FIFO order at %d: got %d, want %d", i, v, i+1)
					}
				}
				waitDrained(t, p)
				p.Stop()
				if left := pendingIn(t, path); left != 0 {
					t.Fatalf("outbox holds %d records after every confirmation", left)
				}
			})
		})
	}
}

func lastIs(s *harness.Subscriber, payload string) bool {
	for _, m := range s.Messages() {
		if string(m.Payload) == payload {
			return true
		}
	}
	return false
}

func TestEndToEndRecordStaysUntilItsExactACK(t *testing.T) {
	brokers(t, func(t *testing.T, clientURL, outputURL string) {
		path := filepath.Join(t.TempDir(), "outbox.db")
		p := streamtest.Start(t, outputConf(outputURL, path, "confirm", "end_to_end", "data_topic", "e2e/data", "ack_topic", "e2e/acks", "ack_timeout", "30s"))
		if err := p.Write(10*time.Second, `{"warmup":true}`, "n", "w", "id", "warmup"); err != nil {
			t.Fatal(err)
		}

		// Phase 1: the consumer answers only with forged ACKs: a wrong ID, a
		// malformed one, and one with extra fields. Nothing may be deleted.
		var honest atomic.Bool
		acker := harness.StartAcker(t, clientURL, "e2e/data", "e2e/acks", func(in envelope.Ingress) [][]byte {
			wrong, _ := envelope.EncodeAck(in.EventID + "x")
			forged := [][]byte{wrong, []byte(`{"event_id":"` + in.EventID + `"}`), []byte(`{"event_id":"` + in.EventID + `","version":1,"extra":1}`), []byte("not json")}
			if !honest.Load() {
				return forged
			}
			good, _ := envelope.EncodeAck(in.EventID)
			return append(forged, good, good) // the second good one is a duplicate
		})
		if err := p.Write(10*time.Second, `{"temperature":25.2}`, "n", "a", "id", "evt-1"); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, waitLong, "the envelope at the consumer", func() bool { return seenID(acker, "evt-1") })
		harness.Eventually(t, waitLong, "forged ACKs to be ignored", func() bool {
			return p.Logs.Contains("Ignoring malformed ACK") && p.Logs.Contains("Ignoring unknown ACK for event ")
		})
		// Publishers sharing an ACK topic see each other's ACKs: one warning
		// line per reason and interval, not one per ACK.
		if n := strings.Count(p.Logs.String(), "Ignoring unknown ACK"); n != 1 {
			t.Fatalf("%d warning lines for unknown ACKs within seconds, want 1", n)
		}

		// Phase 2: an honest consumer. The restarted output resends both
		// pending records, oldest first, and they are ACKed (twice each).
		honest.Store(true)
		p.Stop()
		if left := pendingIn(t, path); left != 2 {
			t.Fatalf("outbox holds %d records, want 2 (warmup and evt-1: forged ACKs must not delete)", left)
		}
		p = streamtest.Start(t, outputConf(outputURL, path, "confirm", "end_to_end", "data_topic", "e2e/data", "ack_topic", "e2e/acks"))
		waitDrained(t, p)
		harness.Eventually(t, waitLong, "a duplicate ACK to be counted", func() bool {
			return p.Logs.Contains("Ignoring duplicate ACK for event")
		})
		for _, in := range acker.Seen() {
			if in.EventID == "evt-1" && (in.Topic != "test/a" || string(in.Payload) != `{"temperature":25.2}`) {
				t.Fatalf("envelope carried topic %q payload %s", in.Topic, in.Payload)
			}
		}
		p.Stop()
		if left := pendingIn(t, path); left != 0 {
			t.Fatalf("outbox holds %d records after honest ACKs", left)
		}
	})
}

func seenID(a *harness.Acker, id string) bool {
	for _, in := range a.Seen() {
		if in.EventID == id {
			return true
		}
	}
	return false
}

func TestInvalidMessagesAreRejectedWithAClearErrorAndNothingIsStored(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	p := streamtest.Start(t, outputConf(unreachable, path, "confirm", "end_to_end", "max_payload_bytes", "200", "topic", `'${! meta("n").or("") }'`))
	cases := []struct {
		name, payload, topic, id, wantErr string
	}{
		{"wildcard +", `{}`, "a/+/b", "", "invalid destination topic"},
		{"wildcard #", `{}`, "a/#", "", "invalid destination topic"},
		{"empty topic", `{}`, "", "", "invalid destination topic"},
		{"not JSON", `hello`, "ok", "", "cannot be enveloped"},
		{"NaN", `{"x":NaN}`, "ok", "", "NaN"},
		{"Infinity overflow", `{"x":1e400}`, "ok", "", "cannot be enveloped"},
		{"duplicate key", `{"x":1,"x":2}`, "ok", "", "duplicate key"},
		{"bad event ID", `{}`, "ok", "has space", "event_id"},
		{"oversized", `"` + strings.Repeat("a", 300) + `"`, "ok", "", "exceeds max_payload_bytes"},
	}
	for _, c := range cases {
		err := p.Write(10*time.Second, c.payload, "n", c.topic, "id", c.id)
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.wantErr)
		}
	}
	p.Stop()
	if left := pendingIn(t, path); left != 0 {
		t.Fatalf("rejected messages left %d records in the outbox", left)
	}
}

func TestRetriedEventIDIsIdempotentAndConflictingContentFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	p := streamtest.Start(t, outputConf(unreachable, path))
	for i := 0; i < 2; i++ {
		if err := p.Write(10*time.Second, "same", "n", "a", "id", "evt-7"); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	err := p.Write(10*time.Second, "different", "n", "a", "id", "evt-7")
	if err == nil || !strings.Contains(err.Error(), "evt-7") {
		t.Fatalf("conflicting content under evt-7: got %v, want an error naming the event", err)
	}
	p.Stop()
	if left := pendingIn(t, path); left != 1 {
		t.Fatalf("outbox holds %d records, want exactly 1", left)
	}
}

func TestFullOutboxBlocksWritesInsteadOfDropping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	p := streamtest.Start(t, outputConf(unreachable, path, "outbox", fmt.Sprintf("{ path: %q, max_pending: 3 }", path)))
	for i := 0; i < 3; i++ {
		if err := p.Write(10*time.Second, strconv.Itoa(i), "n", "a"); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	start := time.Now()
	err := p.Write(time.Second, "3", "n", "a")
	if err == nil {
		t.Fatal("a write into a full outbox succeeded")
	}
	if time.Since(start) < 900*time.Millisecond {
		t.Fatalf("the write into a full outbox failed at once (%v) instead of waiting", err)
	}
	p.Stop()
	if left := pendingIn(t, path); left != 3 {
		t.Fatalf("outbox holds %d records, want 3", left)
	}
}

func TestRestartContinuesWithTheSameIDsOldestFirst(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	path := filepath.Join(t.TempDir(), "outbox.db")
	conf := outputConf(unreachable, path, "envelope", "delivery", "window", "1", "topic", "test/restart")
	p := streamtest.Start(t, conf)
	for i := 0; i < 50; i++ {
		if err := p.Write(10*time.Second, strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	p.Stop()
	sub := harness.Subscribe(t, m.URL(), "restart-sub", true, "test/restart")
	p = streamtest.Start(t, strings.Replace(conf, unreachable, m.URL(), 1))
	harness.Eventually(t, waitLong, "50 deliveries", func() bool { return sub.Count() >= 50 })
	waitDrained(t, p)
	ids := map[string]bool{}
	for i, msg := range sub.Messages()[:50] {
		d, err := envelope.DecodeDelivery(msg.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if string(d.Payload) != strconv.Itoa(i) {
			t.Fatalf("delivery %d carried %s: not oldest first", i, d.Payload)
		}
		if ids[d.EventID] {
			t.Fatalf("event ID %s used twice", d.EventID)
		}
		ids[d.EventID] = true
	}
}

func TestDirectModeAcknowledgesOnlyAfterTheACK(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	conf := func(ackTopic string) string {
		return fmt.Sprintf(`
reliable_mqtt_out:
  urls: [ %q ]
  topic: test/direct
  confirm: end_to_end
  data_topic: direct/data
  ack_topic: %s
  ack_timeout: 1s
  outbox:
    enabled: false
`, m.URL(), ackTopic)
	}
	acker := harness.StartAcker(t, m.URL(), "direct/data", "direct/acks", nil)
	p := streamtest.Start(t, conf("direct/acks"))
	if err := p.Write(20*time.Second, `{"a":1}`); err != nil {
		t.Fatalf("direct write with an ACKing consumer: %v", err)
	}
	if len(acker.Seen()) == 0 {
		t.Fatal("write returned before the consumer had the message")
	}
	p.Stop()

	// ACKs go to a topic this output does not listen on: the write must fail.
	p = streamtest.Start(t, conf("direct/elsewhere"))
	err := p.Write(20*time.Second, `{"a":2}`)
	if err == nil || !strings.Contains(err.Error(), "no ACK") {
		t.Fatalf("direct write without ACK: got %v, want a timeout error", err)
	}
}

func TestForeignOutboxFileIsRefusedAtStartAndLeftUntouched(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	garbage := []byte(strings.Repeat("not a database\n", 500))
	if err := os.WriteFile(path, garbage, 0o644); err != nil {
		t.Fatal(err)
	}
	p := streamtest.Start(t, outputConf(unreachable, path))
	select {
	case <-p.Ended():
		if err := p.Err(); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("stream ended with %v, want an error naming %s", err, path)
		}
	case <-time.After(waitLong):
		t.Fatal("the stream kept running on a foreign outbox file")
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != string(garbage) {
		t.Fatalf("the refused file was changed (err %v)", err)
	}
}

// Every message-level refusal is permanent and says so in a way a fallback
// output can route on; a null event ID (missing metadata) is one of them,
// with the fix in the message; a message flagged with an error is refused
// too (not permanent: the flag's cause may pass). Nothing is stored.
func TestPermanentRefusalsSaySoAndNullEventIDIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	p := streamtest.Start(t, outputConf(unreachable, path, "event_id", `'${! meta("id") }'`, "max_payload_bytes", "100"))
	err := p.Write(10*time.Second, `{}`, "n", "a")
	if err == nil || !strings.HasPrefix(err.Error(), mqttout.PermanentPrefix) || !strings.Contains(err.Error(), `event_id evaluated to "null"`) || !strings.Contains(err.Error(), `.or("")`) {
		t.Fatalf("null event ID: got %v, want a permanent error naming event_id and the .or(\"\") fix", err)
	}
	for _, c := range []struct{ payload, topic, id string }{
		{`{}`, "a/+", "ok-1"},
		{strings.Repeat("x", 200), "a", "ok-2"},
		{`{}`, "a", "bad id"},
	} {
		err := p.Write(10*time.Second, c.payload, "n", c.topic, "id", c.id)
		if err == nil || !strings.HasPrefix(err.Error(), mqttout.PermanentPrefix) {
			t.Errorf("topic %q id %q: got %v, want an error starting with %q", c.topic, c.id, err, mqttout.PermanentPrefix)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	flagged := service.NewMessage([]byte(`{}`))
	flagged.MetaSetMut("n", "a")
	flagged.MetaSetMut("id", "ok-3")
	flagged.SetError(errors.New("upstream processor failed"))
	err = p.Send(ctx, flagged)
	if err == nil || strings.HasPrefix(err.Error(), mqttout.PermanentPrefix) || !strings.Contains(err.Error(), "upstream processor failed") {
		t.Fatalf("flagged message: got %v, want a (transient) refusal carrying the flag's error", err)
	}
	p.Stop()
	if left := pendingIn(t, path); left != 0 {
		t.Fatalf("refused messages left %d records in the outbox", left)
	}
}

func TestUnreadableRecordIsSkippedAndKeptWhileTheOthersAreDelivered(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	path := filepath.Join(t.TempDir(), "outbox.db")
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var bad uint64
	for i, p := range []string{"first", "damaged", "third"} {
		rec, err := ob.Append(context.Background(), outbox.Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "test/corrupt", Payload: []byte(p)}})
		if err != nil {
			t.Fatal(err)
		}
		if p == "damaged" {
			bad = rec.Seq
		}
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	// Damage the middle record's bytes the way a bad disk block would.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := binary.BigEndian.AppendUint64(nil, bad)
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("outbox/records")).Put(key, []byte{1, 2}) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	sub := harness.Subscribe(t, m.URL(), "corrupt-sub", true, "test/corrupt")
	p := streamtest.Start(t, outputConf(m.URL(), path)) // a window wider than the damage: Read returns records before it too
	harness.Eventually(t, waitLong, "both readable records delivered", func() bool { return sub.Count() >= 2 })
	harness.Eventually(t, waitLong, "the damaged record reported", func() bool {
		return p.Logs.Contains(fmt.Sprintf("record seq %d", bad))
	})
	p.Stop()
	var got []string
	for _, msg := range sub.Messages() {
		got = append(got, string(msg.Payload))
	}
	if strings.Join(got, ",") != "first,third" {
		t.Fatalf("delivered %v, want first then third", got)
	}
	// Kept, out of the queue: moved byte for byte to the damaged bucket.
	ob, err = outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	if st := ob.Stats(); st.Pending != 0 || st.Damaged != 1 {
		t.Fatalf("outbox stats %+v, want 0 pending and the damaged record counted", st)
	}
}

// With ack_auth_keys only an ACK whose auth verifies confirms a record:
// a plain reliomq v1 ACK and one signed with another key are ignored and
// counted as unauthenticated while the record stays; an ACK signed with the
// second (older) key of the rotation list confirms it.
func TestForgedACKsDoNotConfirmWhenACKsAreAuthenticated(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	path := filepath.Join(t.TempDir(), "outbox.db")
	var honest atomic.Bool
	acker := harness.StartAcker(t, m.URL(), "auth/data", "auth/acks", func(in envelope.Ingress) [][]byte {
		plain, _ := envelope.EncodeAck(in.EventID)
		other, _ := envelope.EncodeAuthAck(in.EventID, []byte("someone-else"))
		if !honest.Load() {
			return [][]byte{plain, other}
		}
		good, _ := envelope.EncodeAuthAck(in.EventID, []byte("old-key"))
		return [][]byte{good}
	})
	p := streamtest.Start(t, outputConf(m.URL(), path, "confirm", "end_to_end", "data_topic", "auth/data", "ack_topic", "auth/acks",
		"ack_timeout", "1s", "ack_auth_keys", "[ new-key, old-key ]"))
	if err := p.Write(10*time.Second, `{"v":1}`, "n", "a", "id", "evt-auth"); err != nil {
		t.Fatal(err)
	}
	// Resent after each ack_timeout: it was not confirmed by the forgeries.
	harness.Eventually(t, waitLong, "the record published three times", func() bool { return len(acker.Seen()) >= 3 })
	if !p.Logs.Contains("Ignoring unauthenticated ACK for event evt-auth") {
		t.Fatalf("no unauthenticated ACK logged:\n%s", p.Logs.String())
	}
	// Stats lines come in order, and the first ones (before the write)
	// show an empty outbox: none after one that shows the record may.
	harness.Eventually(t, waitLong, "a stats line with the record pending", func() bool { return p.Logs.Contains("; 1 pending (") })
	if log := p.Logs.String(); strings.Contains(log[strings.Index(log, "; 1 pending ("):], "; 0 pending (0 bytes)") {
		t.Fatal("the outbox emptied on forged ACKs")
	}
	honest.Store(true)
	waitDrained(t, p)
}

// retained: a constant applies to every record (outbox mode), an
// interpolation per message (direct mode); a subscriber that arrives later
// gets exactly the retained ones. An interpolation with the outbox on is
// refused at start.
func TestRetainedIsSetFromConfigOrPerMessage(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	path := filepath.Join(t.TempDir(), "outbox.db")
	p := streamtest.Start(t, outputConf(m.URL(), path, "retained", "true", "topic", "ret/const"))
	if err := p.Write(10*time.Second, "kept", "id", "r-1"); err != nil {
		t.Fatal(err)
	}
	waitDrained(t, p)
	p.Stop()

	d := streamtest.Start(t, outputConf(m.URL(), path, "outbox", "{ enabled: false }", "retained", `'${! meta("r") }'`))
	if err := d.Write(10*time.Second, "yes", "n", "a", "r", "true"); err != nil {
		t.Fatal(err)
	}
	if err := d.Write(10*time.Second, "no", "n", "b", "r", "false"); err != nil {
		t.Fatal(err)
	}
	if err := d.Write(10*time.Second, "bad", "n", "c", "r", "maybe"); err == nil || !strings.HasPrefix(err.Error(), mqttout.PermanentPrefix) {
		t.Fatalf("retained \"maybe\": got %v, want a permanent refusal", err)
	}

	late := harness.Subscribe(t, m.URL(), "late-sub", true, "ret/#", "test/#")
	if !late.WaitCount(2, 10*time.Second) {
		t.Fatalf("late subscriber got %d retained messages, want 2", late.Count())
	}
	got := map[string]bool{}
	for _, r := range late.Messages() {
		got[r.Topic+"="+string(r.Payload)] = r.Retained
	}
	if !got["ret/const=kept"] || !got["test/a=yes"] || len(got) != 2 {
		t.Fatalf("late subscriber got %v, want ret/const=kept and test/a=yes, retained", got)
	}

	if err := startErr(t, outputConf(m.URL(), filepath.Join(t.TempDir(), "o.db"), "retained", `'${! meta("r") }'`)); err == nil || !strings.Contains(err.Error(), "outbox.enabled: false") {
		t.Fatalf("interpolated retained with an outbox: %v", err)
	}
}
