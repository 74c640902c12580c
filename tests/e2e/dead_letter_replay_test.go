package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// deadLetter is the form config/bridge.yaml gives a dead letter
// (docs/guarantees.md, "Dead letters").
type deadLetter struct {
	DeadLetter struct {
		Reason      string `json:"reason"`
		SourceTopic string `json:"source_topic"`
	} `json:"dead_letter"`
	EventID       string `json:"event_id"`
	Topic         string `json:"topic"`
	Version       int    `json:"version"`
	PayloadBase64 []byte `json:"payload_base64"`
	payload       []byte // the "payload" field's bytes as they are in the message
}

// parseDeadLetter decodes a dead letter and checks its documented shape:
// valid JSON, version 1, the payload last.
func parseDeadLetter(t *testing.T, b []byte) deadLetter {
	t.Helper()
	var dl deadLetter
	if err := json.Unmarshal(b, &dl); err != nil {
		t.Fatalf("a dead letter that is not the documented JSON object: %v (%.200q)", err, b)
	}
	var raw struct {
		Payload json.RawMessage `json:"payload"`
	}
	_ = json.Unmarshal(b, &raw)
	dl.payload = raw.Payload
	if raw.Payload != nil {
		i := bytes.Index(b, []byte(`,"payload":`))
		if i < 0 || !bytes.Equal(b[i+len(`,"payload":`):len(b)-1], raw.Payload) {
			t.Fatalf("the payload is not the dead letter's last field, bytes unchanged (%.200q)", b)
		}
	}
	if dl.Version != 1 || dl.DeadLetter.Reason == "" || dl.DeadLetter.SourceTopic == "" {
		t.Fatalf("a dead letter without version 1, reason or source topic: %.300q", b)
	}
	return dl
}

// The whole life of a dead letter with the shipped configs: a valid 10 MB
// envelope is refused by the bridge (max_payload_bytes), dead-lettered
// with its event ID, destination topic, reason and source topic; once the
// limit is raised, config/replay_dead_letters.yaml sends it back and the
// consumer receives it, payload and identity unchanged.
func TestDeadLetterCarriesItsIdentityAndIsReplayedAfterTheFix(t *testing.T) {
	source := harness.StartMosquitto(t, harness.MosquittoOptions{})
	dest := harness.StartMosquitto(t, harness.MosquittoOptions{})
	consumer := harness.StartAcker(t, dest.URL(), "reliable/deliveries", "reliable/consumer-acks", nil)
	watcher := harness.Subscribe(t, dest.URL(), "dead-letter-watch", false, deadLetterTopic)
	dataDir := t.TempDir()
	env := []string{"SOURCE_BROKER=" + source.URL(), "DEST_BROKER=" + dest.URL(), "DATA_DIR=" + dataDir}

	// The replay's session exists before anything is dead-lettered, as the
	// config's comment asks: run it once, stop it.
	replay := harness.RunPipeline(t, harness.ShippedConfig(t, "replay_dead_letters.yaml"), harness.ProcOptions{Env: env, Args: []string{"-s", "http.address=" + httpAddr(t)}})
	if !replay.WaitForLog("Input type reliable_mqtt_in is now active", 2*time.Minute) {
		t.Fatal("the replay's input never became active")
	}
	if err := replay.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}

	bridge := harness.RunPipeline(t, harness.ShippedConfig(t, "bridge.yaml"), harness.ProcOptions{Env: env, Args: []string{"-s", "http.address=" + httpAddr(t)}})
	if !bridge.WaitForLog("Input type reliable_mqtt_in is now active", 2*time.Minute) {
		t.Fatal("the bridge's input never became active")
	}
	payload := `{"blob":"` + strings.Repeat("x", 10<<20) + `","n":12345678901234567890}`
	harness.Publish(t, source.URL(), "reliable/ingress", [][]byte{ingress(t, "big-10mb", "sensors/big", payload)})

	if !watcher.WaitCount(1, 90*time.Second) {
		t.Fatalf("no dead letter within 90s; bridge log:\n%s", harness.TailLines(bridge.Log(), 30))
	}
	dl := parseDeadLetter(t, watcher.Messages()[0].Payload)
	if dl.EventID != "big-10mb" || dl.Topic != "sensors/big" || dl.DeadLetter.SourceTopic != "reliable/ingress" ||
		!strings.Contains(dl.DeadLetter.Reason, "exceeds max_payload_bytes") || string(dl.payload) != payload {
		t.Fatalf("dead letter: event %q, topic %q, source topic %q, reason %q, payload of %d bytes (equal: %v); want big-10mb, sensors/big, reliable/ingress, a reason naming max_payload_bytes, the payload unchanged",
			dl.EventID, dl.Topic, dl.DeadLetter.SourceTopic, dl.DeadLetter.Reason, len(dl.payload), string(dl.payload) == payload)
	}
	t.Logf("dead letter reason: %s", dl.DeadLetter.Reason)
	if n := len(consumer.Seen()); n != 0 {
		t.Fatalf("the consumer received %d messages before the fix", n)
	}

	// The fix: the bridge again, with the limit raised; then the replay.
	if err := bridge.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	bridge = harness.RunPipeline(t, harness.ShippedConfig(t, "bridge.yaml"), harness.ProcOptions{
		Env: append(env, fmt.Sprintf("MAX_PAYLOAD_BYTES=%d", 20<<20)), Args: []string{"-s", "http.address=" + httpAddr(t)}})
	if !bridge.WaitForLog("Input type reliable_mqtt_in is now active", 2*time.Minute) {
		t.Fatal("the restarted bridge's input never became active")
	}
	replay.Restart()
	harness.Eventually(t, 2*time.Minute, "the replayed event at the consumer", func() bool { return len(consumer.Seen()) >= 1 })
	got := consumer.Seen()[0]
	if got.EventID != "big-10mb" || got.Topic != "sensors/big" || string(got.Payload) != payload {
		t.Fatalf("the consumer received event %q for %q with %d payload bytes (equal: %v); want big-10mb for sensors/big, unchanged",
			got.EventID, got.Topic, len(got.Payload), string(got.Payload) == payload)
	}
	// Replayed, and not dead-lettered again.
	harness.Eventually(t, 30*time.Second, "the replay to log the replay", func() bool {
		return strings.Contains(replay.Log(), "replaying event big-10mb to sensors/big")
	})
	if n := watcher.Count(); n != 1 {
		t.Fatalf("%d dead letters, want 1: the replay was dead-lettered again", n)
	}
}
