package ledger

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/dedup"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"

	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttin"
)

// failOnce fails each event named in its list on that event's first
// attempt only (the event's other attempts, and every other event, pass):
// a pipeline where one event of a frame fails once.
var failOnce = struct {
	sync.Mutex
	failed map[string]bool
}{failed: map[string]bool{}}

// sink records the event IDs it applied, in order, per test (label).
var sink = struct {
	sync.Mutex
	applied map[string][]string
}{applied: map[string][]string{}}

func init() {
	err := service.RegisterBatchProcessor("test_fail_first_attempt",
		service.NewConfigSpec().Field(service.NewStringField("scope")).Field(service.NewStringListField("event_ids")),
		func(conf *service.ParsedConfig, _ *service.Resources) (service.BatchProcessor, error) {
			scope, err := conf.FieldString("scope")
			if err != nil {
				return nil, err
			}
			ids, err := conf.FieldStringList("event_ids")
			return failFirst{scope: scope, ids: ids}, err
		})
	if err == nil {
		err = service.RegisterBatchOutput("test_sink",
			service.NewConfigSpec().Field(service.NewStringField("name")),
			func(conf *service.ParsedConfig, _ *service.Resources) (service.BatchOutput, service.BatchPolicy, int, error) {
				name, err := conf.FieldString("name")
				return sinkOutput(name), service.BatchPolicy{}, 1, err
			})
	}
	if err != nil {
		panic(err)
	}
}

// failFirst fails ids on their first attempt within scope (one per run of
// a test).
type failFirst struct {
	scope string
	ids   []string
}

func (f failFirst) ProcessBatch(_ context.Context, b service.MessageBatch) ([]service.MessageBatch, error) {
	failOnce.Lock()
	defer failOnce.Unlock()
	for _, m := range b {
		id, _ := m.MetaGet("event_id")
		if slices.Contains(f.ids, id) && !failOnce.failed[f.scope+"/"+id] {
			failOnce.failed[f.scope+"/"+id] = true
			m.SetError(fmt.Errorf("event %s fails its first attempt", id))
		}
	}
	return []service.MessageBatch{b}, nil
}
func (failFirst) Close(context.Context) error { return nil }

type sinkOutput string

func (sinkOutput) Connect(context.Context) error { return nil }
func (s sinkOutput) WriteBatch(_ context.Context, b service.MessageBatch) error {
	sink.Lock()
	defer sink.Unlock()
	for _, m := range b {
		id, _ := m.MetaGet("event_id")
		sink.applied[string(s)] = append(sink.applied[string(s)], id)
	}
	return nil
}
func (sinkOutput) Close(context.Context) error { return nil }

// runFrameStream runs reliable_mqtt_in (envelope: ingress, ACKs to acks/t)
// → dedup_ledger on the bbolt file at path → test_fail_first_attempt
// (ev-2) → output until the frame's ACK arrives, then stops it.
func runFrameStream(t *testing.T, b *harness.Mosquitto, clientID, path, output string) {
	t.Helper()
	runFrameStreamWith(t, b, clientID, fmt.Sprintf("{ path: %q }", path), output)
}

// runFrameStreamWith is runFrameStream with the dedup_ledger's YAML body.
func runFrameStreamWith(t *testing.T, b *harness.Mosquitto, clientID, ledgerConf, output string) {
	t.Helper()
	acks := harness.Subscribe(t, b.URL(), "ack-watcher-"+clientID, true, "acks/t")
	// The input's session exists before the frame is published: the broker
	// queues it for the input, whenever the stream subscribes.
	harness.Subscribe(t, b.URL(), clientID, false, "in/#").Close()
	events := []frame.Event{
		{ID: "ev-1", Topic: "dest/a", Payload: []byte(`{"n":1}`)},
		{ID: "ev-2", Topic: "dest/a", Payload: []byte(`{"n":2}`)},
		{ID: "ev-3", Topic: "dest/a", Payload: []byte(`{"n":3}`)},
	}
	raw, id, err := frame.Encode(events, frame.Options{Compression: frame.Zstd})
	if err != nil {
		t.Fatal(err)
	}
	s := streamtest.StartConfig(t, fmt.Sprintf(`
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: %s
    topics: [ "in/#" ]
    envelope: ingress
    ack_topic: acks/t
    retry_backoff: { initial_interval: 10ms, max_interval: 100ms }
pipeline:
  processors:
    - dedup_ledger: %s
    - test_fail_first_attempt: { scope: %s, event_ids: [ ev-2 ] }
output:
  reject_errored:
%s
`, b.URL(), clientID, ledgerConf, fmt.Sprint(clientID, "-", time.Now().UnixNano()), output))
	defer func() {
		s.Stop()
		if t.Failed() {
			t.Logf("stream log:\n%s", s.Logs.String())
		}
	}()
	harness.Publish(t, b.URL(), "in/x", [][]byte{raw})
	if !acks.WaitCount(1, 20*time.Second) {
		t.Fatal("no ACK for the frame")
	}
	time.Sleep(300 * time.Millisecond) // a second ACK would arrive by now
	if n := acks.Count(); n != 1 || string(acks.Messages()[0].Payload) != fmt.Sprintf(`{"event_id":%q,"version":1}`, id) {
		t.Fatalf("%d ACKs, the first %s; want one naming frame %s", n, acks.Messages()[0].Payload, id)
	}
}

// lookupKeys reports which of ids the ledger file at path holds.
func lookupKeys(t *testing.T, path string, ids ...string) {
	t.Helper()
	l, err := ledger.Open(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, id := range ids {
		key, err := dedup.NewKey("", id)
		if err != nil {
			t.Fatal(err)
		}
		if applied, _, _, err := l.Lookup(key); err != nil || !applied {
			t.Errorf("key %s: applied %v, %v", id, applied, err)
		}
	}
}

// A frame whose second event fails once comes back whole; the ledger has
// recorded the keys of the events that succeeded (each event's hooks see
// its own result), so the redelivered frame applies only the failed one:
// every event reaches the output exactly once, and one ACK names the frame.
func TestFrameWithAFailedEventIsAppliedOnceEach(t *testing.T) {
	b := harness.StartMosquitto(t, harness.MosquittoOptions{Persistence: true, MaxInflight: 100})
	path := filepath.Join(t.TempDir(), "ledger.db")
	name := fmt.Sprint("hooks-", time.Now().UnixNano()) // one sink per run
	runFrameStream(t, b, "frame-ledger", path, "    test_sink: { name: "+name+" }")
	sink.Lock()
	got := sink.applied[name]
	sink.Unlock()
	if want := []string{"ev-1", "ev-3", "ev-2"}; !slices.Equal(got, want) {
		t.Fatalf("the output applied %v, want %v (each once, the failed one on the frame's second delivery)", got, want)
	}
	lookupKeys(t, path, "ev-1", "ev-2", "ev-3")
}

// The same on the SQL ledger (SQLite, without apply): its keys are
// recorded per event when the frame settles, and the redelivered frame
// again applies only the failed event.
func TestFrameWithAFailedEventIsAppliedOnceEachOnSQL(t *testing.T) {
	b := harness.StartMosquitto(t, harness.MosquittoOptions{Persistence: true, MaxInflight: 100})
	dsn := filepath.Join(t.TempDir(), "ledger.sqlite")
	name := fmt.Sprint("sql-", time.Now().UnixNano()) // one sink per run
	runFrameStreamWith(t, b, "frame-sql", fmt.Sprintf("{ sql: { driver: sqlite, dsn: %q } }", dsn), "    test_sink: { name: "+name+" }")
	sink.Lock()
	got := sink.applied[name]
	sink.Unlock()
	if want := []string{"ev-1", "ev-3", "ev-2"}; !slices.Equal(got, want) {
		t.Fatalf("the output applied %v, want %v (each once, the failed one on the frame's second delivery)", got, want)
	}
}

// The relay of config/ledger_relay.yaml with frames: dedup_ledger and
// reliable_mqtt_out's outbox share one file, so a key and its record commit
// together; a frame whose second event fails once comes back whole and the
// outbox gets each event exactly once (and the relay publishes each once).
func TestFrameThroughTheLedgerRelayIsEnqueuedOnceEach(t *testing.T) {
	b := harness.StartMosquitto(t, harness.MosquittoOptions{Persistence: true, MaxInflight: 100})
	out := harness.Subscribe(t, b.URL(), "out-watcher", true, "events/out")
	path := filepath.Join(t.TempDir(), "relay.db")
	runFrameStream(t, b, "frame-relay", path, fmt.Sprintf(`    reliable_mqtt_out:
      urls: [ %q ]
      client_id: frame-relay-out
      topic: events/out
      event_id: ${! meta("event_id") }
      outbox: { path: %q }`, b.URL(), path))
	if !out.WaitCount(3, 10*time.Second) {
		t.Fatalf("the relay published %d events, want 3", out.Count())
	}
	time.Sleep(300 * time.Millisecond)
	var got []string
	for _, m := range out.Messages() {
		got = append(got, string(m.Payload))
	}
	slices.Sort(got)
	if want := []string{`{"n":1}`, `{"n":2}`, `{"n":3}`}; !slices.Equal(got, want) {
		t.Fatalf("the relay published %v, want each event once: %v", got, want)
	}
	lookupKeys(t, path, "ev-1", "ev-2", "ev-3")
}
