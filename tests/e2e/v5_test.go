package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// TestV5PropertiesChainCarriesBinaryPayloadsByteForByte: a publisher
// (MQTT 5, confirm: end_to_end, envelope: properties) → bridge (MQTT 5,
// envelope: properties, ack_topic; its output publishes with envelope:
// properties) → broker → an MQTT 5 subscriber, on mosquitto and on the
// embedded broker. The payloads are random bytes that are not UTF-8 and
// contain NUL. Asserted: every payload arrives byte for byte, always with
// the same event_id user property (a redelivered copy too), distinct
// payloads with distinct IDs, nothing arrives that was not sent, and the
// publisher's outbox is empty afterwards (`reliable-mqtt outbox stat`).
// In the sigkill variant the bridge is SIGKILLed mid-stream and restarted.
func TestV5PropertiesChainCarriesBinaryPayloadsByteForByte(t *testing.T) {
	for _, kind := range v5BrokerKinds {
		for _, kill := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sigkill_bridge=%v", kind.name, kill), func(t *testing.T) {
				b := kind.start(t)
				const n, size = 300, 64
				file, payloads := v5Payloads(t, n, size)
				sub := v5Subscribe(t, b.addr, "v5-final", "v5/dest")
				bridge := harness.RunPipeline(t, v5Bridge(b.url(),
					[]string{`protocol_version: "5"`, "envelope: properties", "ack_topic: v5/acks"},
					[]string{`protocol_version: "5"`, "envelope: properties"}), harness.ProcOptions{})
				outboxPath := filepath.Join(t.TempDir(), "outbox.db")
				pub := harness.RunPipeline(t, v5Publisher(b.url(), file, size, outboxPath,
					"topic: v5/dest", "confirm: end_to_end", "envelope: properties",
					"data_topic: v5/data", "ack_topic: v5/acks", "window: 16"), harness.ProcOptions{})
				t.Cleanup(func() {
					if t.Failed() {
						t.Logf("bridge log:\n%s", harness.TailLines(bridge.Log(), 40))
						t.Logf("publisher log:\n%s", harness.TailLines(pub.Log(), 40))
					}
				})

				want := map[string]bool{}
				for _, p := range payloads {
					want[string(p)] = true
				}
				delivered := func() map[string]bool {
					got := map[string]bool{}
					for _, m := range sub.Messages() {
						got[string(m.Payload)] = true
					}
					return got
				}
				if kill {
					harness.Eventually(t, 90*time.Second, "a quarter of the payloads delivered", func() bool { return len(delivered()) >= n/4 })
					bridge.Kill()
					if len(delivered()) >= n {
						t.Fatal("everything was delivered before the SIGKILL: the test did not test a crash")
					}
					time.Sleep(time.Second)
					bridge.Restart()
				}
				harness.Eventually(t, 90*time.Second, fmt.Sprintf("all %d payloads delivered", n), func() bool {
					got := delivered()
					for p := range want {
						if !got[p] {
							return false
						}
					}
					return true
				})
				harness.Eventually(t, 60*time.Second, "the publisher's outbox to drain", func() bool {
					return strings.Contains(harness.LastStatsLine(pub.RunLog()), "; 0 pending (0 bytes)")
				})
				if err := pub.Stop(15 * time.Second); err != nil {
					t.Fatal(err)
				}
				if st := outboxStatJSON(t, outboxPath); st.Pending != 0 {
					t.Fatalf("outbox stat: %d pending after every payload was delivered", st.Pending)
				}

				idOf, payloadOf := map[string]string{}, map[string]string{}
				msgs := sub.Messages()
				for _, m := range msgs {
					if !want[string(m.Payload)] {
						t.Fatalf("received a payload that was never sent (%d bytes, %x...)", len(m.Payload), m.Payload[:min(8, len(m.Payload))])
					}
					if err := envelope.CheckEventID(m.EventID); err != nil {
						t.Fatalf("a delivery without a valid event_id user property: %v (properties %v)", err, m.User)
					}
					if id, seen := idOf[string(m.Payload)]; seen && id != m.EventID {
						t.Fatalf("one payload arrived with event IDs %s and %s", id, m.EventID)
					}
					if p, seen := payloadOf[m.EventID]; seen && p != string(m.Payload) {
						t.Fatalf("event ID %s arrived with two different payloads", m.EventID)
					}
					idOf[string(m.Payload)], payloadOf[m.EventID] = m.EventID, string(m.Payload)
				}
				if bytes.Contains(msgs[0].Payload, []byte("event_id")) {
					t.Fatal("the payload carries an envelope: envelope: properties must leave the bytes alone")
				}
				t.Logf("%d payloads, %d deliveries (%d duplicates), outbox empty", n, len(msgs), len(msgs)-n)
			})
		}
	}
}

// TestV5AndV311InteroperateThroughReliomqEnvelopes: an MQTT 5 publisher
// with a 3.1.1 bridge, and a 3.1.1 publisher with an MQTT 5 bridge, both
// with the reliomq v1 JSON envelopes (ingress with end_to_end, delivery
// on the last hop), on one mosquitto. Every event reaches a 3.1.1
// subscriber as a delivery envelope and the publisher's outbox drains.
func TestV5AndV311InteroperateThroughReliomqEnvelopes(t *testing.T) {
	for _, c := range []struct{ name, pub, bridge string }{
		// 3.1.1 is the default. (Written out, "3.1.1" fails Benthos's enum
		// lint in v4.60.0, which reads an option as a dotted path.)
		{"v5_publisher_v311_bridge", `protocol_version: "5"`, ""},
		{"v311_publisher_v5_bridge", "", `protocol_version: "5"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			const n = 100
			m := harness.StartMosquitto(t, harness.MosquittoOptions{MaxInflight: 100})
			sub := harness.Subscribe(t, m.URL(), "interop-final", true, "v5/dest")
			harness.RunPipeline(t, v5Bridge(m.URL(),
				[]string{c.bridge, "envelope: ingress", "ack_topic: v5/acks"},
				[]string{c.bridge, "envelope: delivery"}), harness.ProcOptions{})
			path := filepath.Join(t.TempDir(), "outbox.db")
			pub := outPublisher{url: m.URL(), outboxPath: path, count: n, topic: "v5/dest", window: 16,
				extra: []string{c.pub, "confirm: end_to_end", "data_topic: v5/data", "ack_topic: v5/acks"}}
			p := harness.RunPipeline(t, pub.yaml(), harness.ProcOptions{})
			outWaitDrained(t, p, path, outFromIngress, n, func() map[int]bool { return outDeliveredSet(outDeliveries(t, sub)) })
		})
	}
}

// TestV5RequireSubscribersKeepsTheRecordUntilSomeoneSubscribes: mosquitto
// answers an MQTT 5 publish to a topic nobody subscribes to with PUBACK
// 0x10. With require_subscribers: true the record stays in the outbox: for
// 5 s the stats lines say 1 pending and the log names 0x10 on a few
// resends, at most 20 (the retry backoff, not a hot loop); once a
// subscriber exists it is delivered and the outbox drains. In direct mode
// the write fails the same way, Benthos retries it, and it is delivered
// once the subscriber exists. Without require_subscribers (the control)
// the same PUBACK confirms the record at once and the late subscriber gets
// nothing.
func TestV5RequireSubscribersKeepsTheRecordUntilSomeoneSubscribes(t *testing.T) {
	for _, c := range []struct {
		name    string
		require bool
		outbox  string
	}{
		{"outbox", true, "outbox: { path: %q }"},
		{"direct", true, "outbox: { enabled: false, path: %q }"},
		{"control_without_require_subscribers", false, "outbox: { path: %q }"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := harness.StartMosquitto(t, harness.MosquittoOptions{})
			yaml := v5OneMessage("lonely", m.URL(), "topic: v5/lonely", fmt.Sprintf("require_subscribers: %v", c.require),
				fmt.Sprintf(c.outbox, filepath.Join(t.TempDir(), "outbox.db")),
				"stats_interval: 200ms", "retry_backoff: { initial_interval: 200ms, max_interval: 1s }")
			addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(harness.FreePort(t)))
			p := harness.RunPipeline(t, withPrometheus(t, yaml, addr), harness.ProcOptions{})
			outboxOn := !strings.Contains(c.outbox, "enabled: false")
			reasonCodes := func() float64 {
				fams, err := harness.ScrapeMetrics("http://" + addr + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				n, _ := harness.MetricSum(fams, "reliable_mqtt_out_puback_reason_codes", map[string]string{"code": "0x10"})
				return n
			}
			if c.require {
				harness.Eventually(t, 30*time.Second, "a PUBACK 0x10 in the log", func() bool {
					return strings.Contains(p.RunLog(), "PUBACK 0x10")
				})
				time.Sleep(5 * time.Second)
				if n := strings.Count(p.RunLog(), "PUBACK 0x10"); n < 2 || n > 20 {
					t.Fatalf("%d refusals logged in about 5 s, want a few resends (2 to 20) along the retry backoff", n)
				}
				if n := reasonCodes(); n < 2 {
					t.Fatalf("reliable_mqtt_out_puback_reason_codes{code=\"0x10\"} = %v, want every refusal counted", n)
				}
				if outboxOn && !strings.Contains(harness.LastStatsLine(p.RunLog()), "; 1 pending") {
					t.Fatalf("after 5 s without a subscriber the last stats line is %q, want 1 pending", harness.LastStatsLine(p.RunLog()))
				}
			} else {
				harness.Eventually(t, 30*time.Second, "the record confirmed by the 0x10 PUBACK", func() bool {
					return strings.Contains(harness.LastStatsLine(p.RunLog()), "; 0 pending (0 bytes)")
				})
			}
			sub := harness.Subscribe(t, m.URL(), "late-subscriber", true, "v5/lonely")
			if !c.require {
				time.Sleep(3 * time.Second)
				if sub.Count() != 0 {
					t.Fatalf("without require_subscribers the late subscriber got %d messages, want 0 (mosquitto dropped the only copy)", sub.Count())
				}
				if n := reasonCodes(); n != 0 {
					t.Fatalf("reliable_mqtt_out_puback_reason_codes{code=\"0x10\"} = %v without require_subscribers, want 0 (0x10 is a success then)", n)
				}
				return
			}
			if !sub.WaitCount(1, 30*time.Second) {
				t.Fatal("the kept record did not reach the subscriber within 30 s")
			}
			if got := string(sub.Messages()[0].Payload); got != "lonely" {
				t.Fatalf("payload %q", got)
			}
			if outboxOn {
				harness.Eventually(t, 30*time.Second, "the outbox to drain", func() bool {
					return strings.Contains(harness.LastStatsLine(p.RunLog()), "; 0 pending (0 bytes)")
				})
			}
		})
	}
}

// TestV5ManualAckConsumerHoldsMoreThan20Unacknowledged: mosquitto with its
// default max_inflight_messages (20) queues 100 messages for a persistent
// session; a reliable_mqtt_in whose pipeline never finishes the first
// message (a one-hour sleep) then connects. Over MQTT 3.1.1 mosquitto
// sends it 20 and waits for acknowledgements; over MQTT 5 the input's
// Receive Maximum (receive_buffer_size, 1000) lets all 100 arrive. Shown
// by the input's reliable_mqtt_in_received and reliable_mqtt_in_acked at
// /metrics: 0 acknowledged either way.
func TestV5ManualAckConsumerHoldsMoreThan20Unacknowledged(t *testing.T) {
	for _, c := range []struct {
		name, version string // a YAML line; "": the default, 3.1.1 (see the interop test)
		want          func(received float64) bool
		what          string
	}{
		{"v311", "", func(r float64) bool { return r == 20 }, "exactly 20 (mosquitto's default in-flight limit)"},
		{"v5", `    protocol_version: "5"`, func(r float64) bool { return r == 100 }, "all 100"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := harness.StartMosquitto(t, harness.MosquittoOptions{})
			clientID := "slow-" + c.name
			harness.Subscribe(t, m.URL(), clientID, false, "v5/slow").Close() // the session queues meanwhile
			var payloads [][]byte
			for i := range 100 {
				payloads = append(payloads, []byte(fmt.Sprint(i)))
			}
			harness.Publish(t, m.URL(), "v5/slow", payloads)

			addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(harness.FreePort(t)))
			yaml := fmt.Sprintf(`http:
  enabled: false
shutdown_timeout: 2s
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: %s
%s
    topics: [ "v5/slow" ]
    receive_buffer_size: 1000
pipeline:
  processors:
    - sleep: { duration: 1h }
output:
  drop: {}
`, m.URL(), clientID, c.version)
			harness.RunPipeline(t, withPrometheus(t, yaml, addr), harness.ProcOptions{})
			if !slowPoll(30*time.Second, func() bool {
				fams, err := harness.ScrapeMetrics("http://" + addr + "/metrics")
				received, _ := harness.MetricSum(fams, "reliable_mqtt_in_received", nil)
				return err == nil && received >= 20
			}) {
				t.Fatal("not even 20 messages received within 30 s")
			}
			// Let mosquitto send whatever more it would.
			time.Sleep(3 * time.Second)
			fams, err := harness.ScrapeMetrics("http://" + addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			received, _ := harness.MetricSum(fams, "reliable_mqtt_in_received", nil)
			acked, _ := harness.MetricSum(fams, "reliable_mqtt_in_acked", nil)
			t.Logf("%s: %v received, %v acknowledged", c.name, received, acked)
			if acked != 0 {
				t.Fatalf("%v acknowledged, want 0: the pipeline never finished a message", acked)
			}
			if !c.want(received) {
				t.Fatalf("%v messages received unacknowledged, want %s", received, c.what)
			}
		})
	}
}

// TestV5SharedSubscriptionDeliversEveryMessageAcrossAKill: two MQTT 5
// consumers share $share/g/v5/shared on mosquitto, as the 3.1.1 consumers
// of TestSQLSharedSubscriptionCrashLoopCountsExactly do. 200 messages are
// published while one consumer is SIGKILLed and restarted. Every message
// reaches a consumer's output (acknowledged only after it), both consumers
// get a share, and each delivery names the shared filter in
// mqtt_subscription.
func TestV5SharedSubscriptionDeliversEveryMessageAcrossAKill(t *testing.T) {
	const n = 200
	const filter = "$share/g/v5/shared"
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	var procs []*harness.Proc
	for i := range 2 {
		clientID := fmt.Sprintf("v5-shared-%d", i)
		yaml := fmt.Sprintf(`http: { enabled: false }
input:
  reliable_mqtt_in:
    urls: [ %q ]
    protocol_version: "5"
    client_id: %s
    topics: [ %q ]
    reconnect_backoff: { initial_interval: 50ms, max_interval: 500ms }
pipeline:
  processors:
    - sleep: { duration: 5ms }
    - mapping: 'root = "GOT " + @mqtt_subscription + " " + content().string()'
output:
  stdout: { codec: lines }
`, m.URL(), clientID, filter)
		p := harness.RunPipeline(t, yaml, harness.ProcOptions{})
		procs = append(procs, p)
	}
	// got maps each delivered payload to the subscriptions it came through.
	got := func() map[string][]string {
		seen := map[string][]string{}
		for _, p := range procs {
			for _, m := range v5GotLine.FindAllStringSubmatch(p.Log(), -1) {
				seen[m[2]] = append(seen[m[2]], m[1])
			}
		}
		return seen
	}
	// Both sessions exist once both consumers print their connect line.
	for _, p := range procs {
		if !p.WaitForLog("MQTT connected", 60*time.Second) {
			t.Fatalf("%s did not connect:\n%s", p, harness.TailLines(p.Log(), 20))
		}
	}
	var payloads [][]byte
	for i := range n {
		payloads = append(payloads, []byte(fmt.Sprintf("m%03d", i)))
	}
	done := make(chan error, 1)
	go func() {
		for i := 0; i < n; i += 20 {
			if err := harness.PublishErr(m.URL(), "v5/shared", payloads[i:i+20]); err != nil {
				done <- err
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		done <- nil
	}()
	harness.Eventually(t, 60*time.Second, "the first 40 deliveries", func() bool { return len(got()) >= 40 })
	procs[0].Kill()
	time.Sleep(500 * time.Millisecond)
	procs[0].Restart()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 60*time.Second, fmt.Sprintf("all %d delivered", n), func() bool {
		seen := got()
		for _, p := range payloads {
			if len(seen[string(p)]) == 0 {
				return false
			}
		}
		return true
	})
	for i, p := range procs {
		if c := strings.Count(p.Log(), "GOT "); c == 0 {
			t.Fatalf("consumer %d got no share of the messages", i)
		}
	}
	for p, subs := range got() {
		for _, sub := range subs {
			if sub != filter {
				t.Fatalf("%s was delivered with mqtt_subscription %q, want %q", p, sub, filter)
			}
		}
	}
}

// v5GotLine is a consumer's output line; the payload has a fixed form, so
// a log line written between it and its newline does not change the match.
var v5GotLine = regexp.MustCompile(`GOT (\S+) (m\d{3})`)

// TestV5PropertiesTravelAsMetadataBothWays: a publisher sets
// user_properties (one from metadata), content_type and message_expiry
// with envelope: properties; a consumer (envelope: properties) on the
// same mosquitto prints what its metadata says. The user properties come
// out as mqtt_user_property_<name>, the event ID as event_id, the content
// type and the remaining expiry (at most the hour that was set) too.
func TestV5PropertiesTravelAsMetadataBothWays(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	consumer := harness.RunPipeline(t, fmt.Sprintf(`http: { enabled: false }
input:
  reliable_mqtt_in:
    urls: [ %q ]
    protocol_version: "5"
    client_id: v5-meta
    topics: [ "v5/meta" ]
    envelope: properties
pipeline:
  processors:
    - mapping: |
        root = "META " + {"event_id": @event_id, "site": @mqtt_user_property_site, "line": @mqtt_user_property_line,
          "content_type": @mqtt_content_type, "expiry": @mqtt_message_expiry,
          "destination": @destination_topic.or("none"), "body": content().string()}.format_json(no_indent: true)
output:
  stdout: { codec: lines }
`, m.URL()), harness.ProcOptions{})
	if !consumer.WaitForLog("MQTT connected", 60*time.Second) {
		t.Fatalf("the consumer did not connect:\n%s", consumer.Log())
	}
	harness.RunPipeline(t, fmt.Sprintf(`http: { enabled: false }
input:
  sequence:
    inputs:
      - generate:
          count: 1
          interval: ""
          mapping: |
            root = "reading"
            meta site = "plant-7"
      - generate: { interval: 1h, mapping: 'root = deleted()' }
output:
  reliable_mqtt_out:
    urls: [ %q ]
    protocol_version: "5"
    topic: v5/meta
    event_id: ev-meta-1
    envelope: properties
    user_properties: { site: '${! meta("site") }', line: "7" }
    content_type: text/plain
    message_expiry: 1h
    outbox: { path: %q }
`, m.URL(), filepath.Join(t.TempDir(), "outbox.db")), harness.ProcOptions{})
	if !consumer.WaitForLog("META ", 60*time.Second) {
		t.Fatalf("the consumer printed nothing:\n%s", consumer.Log())
	}
	line := regexp.MustCompile(`META (\{[^\n]*?\})`).FindStringSubmatch(consumer.Log())
	if line == nil {
		t.Fatalf("no META line:\n%s", consumer.Log())
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(line[1]), &got); err != nil {
		t.Fatalf("META line %q: %v", line[1], err)
	}
	expiry := got["expiry"]
	delete(got, "expiry")
	want := map[string]string{"event_id": "ev-meta-1", "site": "plant-7", "line": "7", "content_type": "text/plain", "destination": "none", "body": "reading"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("metadata %v, want %v", got, want)
	}
	if secs, err := strconv.Atoi(strings.TrimSuffix(expiry, "s")); err != nil || secs < 3500 || secs > 3600 {
		t.Fatalf("mqtt_message_expiry %q, want the remaining part of 3600s", expiry)
	}
}

// TestV5RefusedPublishKeepsTheRecordAndCountsTheReasonCode: the embedded
// broker's ACL lets user "plant" write only open/#. A reliable_mqtt_out
// (MQTT 5) publishing to secret/x gets PUBACK 0x87 (not authorized) for
// it: the record stays in the outbox (still 1 pending after 5 s), every
// refusal is logged with the code and counted in
// reliable_mqtt_out_puback_reason_codes{code="0x87"}, and it is resent
// along the retry backoff.
func TestV5RefusedPublishKeepsTheRecordAndCountsTheReasonCode(t *testing.T) {
	dir := t.TempDir()
	users := filepath.Join(dir, "users")
	if out, err := exec.Command("mosquitto_passwd", "-b", "-c", users, "plant", "plant-pw").CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_passwd (part of Debian's mosquitto package): %v\n%s", err, out)
	}
	acl := filepath.Join(dir, "acl.yaml")
	if err := os.WriteFile(acl, []byte("plant:\n  write: [ open/# ]\n  read: [ open/# ]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	brokerAddr := v5EmbeddedHost(t, "&users="+users+"&acl="+acl)

	addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(harness.FreePort(t)))
	p := harness.RunPipeline(t, withPrometheus(t, v5OneMessage("classified", "tcp://"+brokerAddr,
		"user: plant", "password: plant-pw", "topic: secret/x", fmt.Sprintf("outbox: { path: %q }", filepath.Join(dir, "outbox.db")),
		"stats_interval: 200ms", "retry_backoff: { initial_interval: 200ms, max_interval: 1s }"), addr), harness.ProcOptions{})
	harness.Eventually(t, 60*time.Second, "a PUBACK 0x87 in the log", func() bool {
		return strings.Contains(p.RunLog(), "PUBACK reason code 0x87")
	})
	time.Sleep(5 * time.Second)
	if n := strings.Count(p.RunLog(), "PUBACK reason code 0x87"); n < 2 || n > 20 {
		t.Fatalf("%d refusals logged in about 5 s, want a few resends (2 to 20) along the retry backoff", n)
	}
	if !strings.Contains(harness.LastStatsLine(p.RunLog()), "; 1 pending") {
		t.Fatalf("the last stats line is %q, want the refused record still pending", harness.LastStatsLine(p.RunLog()))
	}
	fams, err := harness.ScrapeMetrics("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := harness.MetricSum(fams, "reliable_mqtt_out_puback_reason_codes", map[string]string{"code": "0x87"}); n < 2 {
		t.Fatalf("reliable_mqtt_out_puback_reason_codes{code=\"0x87\"} = %v, want every refusal counted", n)
	}
}
