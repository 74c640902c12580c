package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

const deadLetterTopic = "reliable/dead-letter"

// poisonRig runs the shipped config/bridge.yaml between two mosquittos. The
// source keeps mosquitto's default of 20 messages in flight, so a message
// that is never acknowledged stalls everything behind it. The main output
// reaches the destination through a proxy the test can cut; the dead-letter
// output dials the destination directly, so a dead-letter would be possible
// during the cut.
type poisonRig struct {
	source, dest *harness.Mosquitto
	proxy        *harness.Proxy
	bridge       *harness.Proc
	consumer     *harness.Acker // ACKs what reaches reliable/deliveries, like config/consumer.yaml
	deadLetters  *harness.Subscriber
	publisherAck *harness.Subscriber // reliable/acks on the source
}

func startPoisonRig(t *testing.T, custody bool) *poisonRig {
	t.Helper()
	r := &poisonRig{
		source: harness.StartMosquitto(t, harness.MosquittoOptions{}),
		dest:   harness.StartMosquitto(t, harness.MosquittoOptions{}),
	}
	r.proxy = harness.NewProxy(t, r.dest.Addr())
	r.consumer = harness.StartAcker(t, r.dest.URL(), "reliable/deliveries", "reliable/consumer-acks", nil)
	r.deadLetters = harness.Subscribe(t, r.dest.URL(), "poison-dlq", false, deadLetterTopic)
	r.publisherAck = harness.Subscribe(t, r.source.URL(), "poison-acks", false, "reliable/acks")

	conf := harness.ShippedConfig(t, "bridge.yaml")
	const pad = "                "
	dlURLs := pad + `urls: [ "${DEST_BROKER:embedded://?dir=./reliable-mqtt-data/cloud}" ]` + "\n" + pad + "client_id: ${BRIDGE_ID:bridge-1}-dead-letter"
	if !strings.Contains(conf, dlURLs) {
		t.Fatal("config/bridge.yaml changed shape; update the dead-letter URL replacement")
	}
	conf = strings.Replace(conf, dlURLs, fmt.Sprintf("%surls: [ %q ]\n%sclient_id: ${BRIDGE_ID:bridge-1}-dead-letter", pad, r.dest.URL(), pad), 1)
	r.bridge = harness.RunPipeline(t, conf, harness.ProcOptions{
		Env: []string{
			"SOURCE_BROKER=" + r.source.URL(), "DEST_BROKER=" + r.proxy.URL(),
			"DATA_DIR=" + t.TempDir(), fmt.Sprintf("BRIDGE_OUTBOX=%v", custody),
		},
		Args: []string{"--log.level", "info"},
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bridge log tail:\n%s", harness.TailLines(r.bridge.Log(), 60))
		}
	})
	// The bridge's session is new: publish only once it has subscribed.
	harness.Eventually(t, 5*time.Minute, "the bridge's input to be active", func() bool {
		return strings.Contains(r.bridge.Log(), "Input type reliable_mqtt_in is now active")
	})
	return r
}

func ingress(t *testing.T, id, topic, payload string) []byte {
	t.Helper()
	b, err := envelope.EncodeIngress(id, topic, []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// publishGood publishes n valid envelopes good-<from>..good-<from+n-1>.
func (r *poisonRig) publishGood(t *testing.T, from, n int) {
	t.Helper()
	var ps [][]byte
	for i := from; i < from+n; i++ {
		ps = append(ps, ingress(t, fmt.Sprintf("good-%d", i), fmt.Sprintf("factory/m/%d", i), fmt.Sprintf(`{"seq":%d}`, i)))
	}
	harness.Publish(t, r.source.URL(), "reliable/ingress", ps)
}

// destIDs returns the event IDs the consumer received (and ACKed).
func (r *poisonRig) destIDs(t *testing.T) map[string]bool {
	if n := r.consumer.Malformed(); n > 0 {
		t.Fatalf("the consumer got %d messages that are not envelopes", n)
	}
	ids := map[string]bool{}
	for _, in := range r.consumer.Seen() {
		ids[in.EventID] = true
	}
	return ids
}

// A message that can never be forwarded — a valid 2 MiB envelope (beyond
// max_payload_bytes) and a non-JSON message — goes to the dead-letter topic
// once and its source is acknowledged; the 40 good messages behind them all
// arrive, with a source window of 20. A restarted bridge receives neither
// poison message again.
func TestBridgeDeadLettersPermanentFailuresAndKeepsForwarding(t *testing.T) {
	for _, custody := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "custody"}[custody], func(t *testing.T) {
			r := startPoisonRig(t, custody)
			big := ingress(t, "too-big", "factory/m/big", `"`+strings.Repeat("a", 2<<20)+`"`)
			harness.Publish(t, r.source.URL(), "reliable/ingress", [][]byte{big, []byte("not json")})
			r.publishGood(t, 0, 40)

			harness.Eventually(t, 90*time.Second, "40 good events at the destination", func() bool { return len(r.destIDs(t)) >= 40 })
			harness.Eventually(t, 30*time.Second, "2 dead letters", func() bool { return r.deadLetters.Count() >= 2 })
			var sawBig, sawText bool
			for _, m := range r.deadLetters.Messages() {
				dl := parseDeadLetter(t, m.Payload)
				sawBig = sawBig || (dl.EventID == "too-big" && len(dl.payload) > 2<<20)
				sawText = sawText || string(dl.PayloadBase64) == "not json"
			}
			if !sawBig || !sawText {
				t.Fatalf("dead letters: big %v, non-JSON %v; want both", sawBig, sawText)
			}
			if !strings.Contains(r.bridge.Log(), "exceeds max_payload_bytes") || !strings.Contains(r.bridge.Log(), "not a valid reliomq v1 ingress envelope") {
				t.Fatal("the bridge did not log why each message was dead-lettered")
			}

			// The sources were acknowledged: a restarted bridge (same
			// session) gets only the marker, not the poison again.
			if err := r.bridge.Stop(15 * time.Second); err != nil {
				t.Fatal(err)
			}
			r.bridge.Restart()
			r.publishGood(t, 40, 1)
			harness.Eventually(t, 60*time.Second, "the marker at the destination", func() bool { return r.destIDs(t)["good-40"] })
			if n := r.deadLetters.Count(); n != 2 {
				t.Fatalf("%d dead letters after the restart, want 2: a poison message was not acknowledged at the source", n)
			}
			// The dead-lettered envelope is ACKed to its publisher too: the
			// bridge has put it somewhere durable, and an unACKed record
			// would be resent (and dead-lettered) forever.
			harness.Eventually(t, 30*time.Second, "the ACK of the dead-lettered envelope", func() bool {
				for _, m := range r.publisherAck.Messages() {
					if string(m.Payload) == `{"event_id":"too-big","version":1}` {
						return true
					}
				}
				return false
			})
		})
	}
}

// A transient failure is never dead-lettered: while the destination is cut
// off (the dead-letter topic stays reachable) the bridge holds or refuses
// and retries; once it is back every message arrives and nothing was
// dead-lettered.
func TestBridgeRetriesTransientFailuresAndNeverDeadLettersThem(t *testing.T) {
	r := startPoisonRig(t, false)
	r.publishGood(t, 0, 5)
	harness.Eventually(t, 60*time.Second, "5 events at the destination", func() bool { return len(r.destIDs(t)) >= 5 })
	r.proxy.Cut()
	r.publishGood(t, 5, 10)
	// Every message of the cut fails at the output and is tried again: the
	// direct output reports "not connected", so Benthos holds the message
	// and retries Connect until the destination returns (each failed
	// Connect is logged); a write already under way when the link went
	// fails with "no broker connection" and comes back from the source.
	harness.Eventually(t, 60*time.Second, "the output retrying twice (not dead-lettering)", func() bool {
		log := r.bridge.Log()
		if strings.Count(log, "Failed to connect to reliable_mqtt_out: no MQTT connection to") >= 2 {
			return true
		}
		for i := 5; i < 15; i++ {
			if strings.Count(log, fmt.Sprintf("event good-%d: no broker connection", i)) >= 2 {
				return true
			}
		}
		return false
	})
	r.proxy.Restore()
	harness.Eventually(t, 90*time.Second, "15 events at the destination", func() bool { return len(r.destIDs(t)) >= 15 })
	if n := r.deadLetters.Count(); n != 0 {
		t.Fatalf("%d messages dead-lettered during a transient outage, want 0", n)
	}
}
