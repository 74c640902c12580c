package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.golang/paho"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// v5Received is one PUBLISH as the MQTT 5 test subscriber saw it.
type v5Received struct {
	Topic   string
	Payload []byte
	EventID string // the event_id user property ("" without)
	User    paho.UserProperties
}

// v5Sub is an MQTT 5 subscriber (paho.golang, clean start, QoS 1) that
// records every message with its user properties. paho acknowledges each
// one after the handler returns.
type v5Sub struct {
	c    *paho.Client
	mu   sync.Mutex
	msgs []v5Received
}

// v5Subscribe connects an MQTT 5 client to addr (host:port) and subscribes
// to filter at QoS 1, bounded by 10 s; it disconnects at cleanup.
func v5Subscribe(t *testing.T, addr, clientID, filter string) *v5Sub {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("v5 subscriber: dial %s: %v", addr, err)
	}
	s := &v5Sub{}
	s.c = paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			r := v5Received{Topic: pr.Packet.Topic, Payload: append([]byte(nil), pr.Packet.Payload...)}
			if p := pr.Packet.Properties; p != nil {
				r.User = append(r.User, p.User...)
				r.EventID = p.User.Get("event_id")
			}
			s.mu.Lock()
			s.msgs = append(s.msgs, r)
			s.mu.Unlock()
			return true, nil
		}},
	})
	if _, err := s.c.Connect(ctx, &paho.Connect{ClientID: clientID, CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatalf("v5 subscriber %s: connect to %s: %v", clientID, addr, err)
	}
	t.Cleanup(func() { _ = s.c.Disconnect(&paho.Disconnect{ReasonCode: 0}) })
	if _, err := s.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		t.Fatalf("v5 subscriber %s: subscribe %q: %v", clientID, filter, err)
	}
	return s
}

// Messages returns a copy of what arrived so far, in arrival order.
func (s *v5Sub) Messages() []v5Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]v5Received(nil), s.msgs...)
}

// v5Payloads writes n random payloads of size bytes to a file (the
// publisher reads it in chunks of size) and returns them. The bytes come
// from testRand, so E2E_SEED replays a run. Every payload
// starts with 0xff 0x00 (never valid UTF-8, and a NUL), so each is
// binary whatever the random rest.
func v5Payloads(t *testing.T, n, size int) (path string, payloads [][]byte) {
	t.Helper()
	rng := testRand(t, 51)
	var all []byte
	for range n {
		p := make([]byte, size)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		p[0], p[1] = 0xff, 0x00
		payloads = append(payloads, p)
		all = append(all, p...)
	}
	path = filepath.Join(t.TempDir(), "payloads.bin")
	if err := os.WriteFile(path, all, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, payloads
}

// v5Broker is a broker a chain runs on: mosquitto, or an embedded broker
// served by a process of its own (so a killed bridge does not take it
// down).
type v5Broker struct {
	addr string // host:port
}

func (b v5Broker) url() string { return "tcp://" + b.addr }

// v5BrokerKinds are the brokers the MQTT 5 chains run on, by name.
var v5BrokerKinds = []struct {
	name  string
	start func(t *testing.T) v5Broker
}{
	{"mosquitto", func(t *testing.T) v5Broker {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{DurableOnKill: true, MaxInflight: 100})
		return v5Broker{m.Addr()}
	}},
	{"embedded", func(t *testing.T) v5Broker {
		return v5Broker{v5EmbeddedHost(t, "")}
	}},
}

// v5EmbeddedHost runs an embedded broker in a process of its own (so a
// killed client process does not take it down) and returns its listener's
// host:port; query adds URL parameters ("&users=...").
func v5EmbeddedHost(t *testing.T, query string) string {
	t.Helper()
	addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(harness.FreePort(t)))
	host := fmt.Sprintf(`http: { enabled: false }
input:
  reliable_mqtt_in:
    urls: [ "embedded://?dir=%s&listen=%s%s" ]
    client_id: broker-host
    topics: [ "broker-host/unused" ]
output:
  drop: {}
`, filepath.Join(t.TempDir(), "broker"), addr, query)
	p := harness.RunPipeline(t, host, harness.ProcOptions{})
	harness.Eventually(t, 60*time.Second, "the embedded broker's listener", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil && p.Running()
	})
	return addr
}

// v5OneMessage is a pipeline whose input makes one message with payload
// and then idles (so the process stays up), into a reliable_mqtt_out over
// MQTT 5 with the given fields; http is off, for withPrometheus.
func v5OneMessage(payload, url string, fields ...string) string {
	return fmt.Sprintf(`http:
  enabled: false
logger: { level: INFO }
input:
  sequence:
    inputs:
      - generate: { count: 1, interval: "", mapping: 'root = %q' }
      - generate: { interval: 1h, mapping: 'root = deleted()' }
output:
  reliable_mqtt_out:
    urls: [ %q ]
    protocol_version: "5"
%s`, payload, url, outputFields(fields))
}

// v5Publisher reads the payload file in chunks and publishes each chunk
// through an outbox; the input then idles so the outbox can drain. Every
// chunk accepted by the output prints "ACCEPTED" (see outPublisher).
func v5Publisher(url, payloadFile string, chunk int, outboxPath string, fields ...string) string {
	return fmt.Sprintf(`http: { enabled: false }
logger: { level: INFO }
input:
  sequence:
    inputs:
      - file: { paths: [ %q ], scanner: { chunker: { size: %d } } }
      - generate: { interval: 1h, mapping: 'root = deleted()' }
pipeline: { threads: 1 }
output:
  reliable_mqtt_out:
    urls: [ %q ]
    protocol_version: "5"
    outbox: { path: %q }
    stats_interval: 200ms
    publish_timeout: 2s
    ack_timeout: 3s
    reconnect_backoff: { initial_interval: 50ms, max_interval: 500ms }
    retry_backoff: { initial_interval: 100ms, max_interval: 1s }
%s`, payloadFile, chunk, url, outboxPath, outputFields(fields))
}

// v5Bridge is a bridge in plain YAML: reliable_mqtt_in (its envelope and
// ACK topic from inFields) → reliable_mqtt_out in direct mode to the
// destination topic the envelope names, with the event ID it carries.
func v5Bridge(url string, inFields, outFields []string) string {
	return fmt.Sprintf(`http: { enabled: false }
logger: { level: INFO }
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: v5-bridge
    topics: [ "v5/data" ]
    reconnect_backoff: { initial_interval: 50ms, max_interval: 500ms }
%soutput:
  reliable_mqtt_out:
    urls: [ %q ]
    topic: '${! meta("destination_topic") }'
    event_id: '${! meta("event_id") }'
    outbox: { enabled: false }
    publish_timeout: 2s
    reconnect_backoff: { initial_interval: 50ms, max_interval: 500ms }
%s`, url, outputFields(inFields), url, outputFields(outFields))
}
