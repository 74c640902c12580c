package mqttin

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestBadConfigErrors(t *testing.T) {
	base := "urls: [ tcp://127.0.0.1:1 ]\n"
	for _, tc := range []struct{ yaml, want string }{
		{base + "client_id: ''\ntopics: [ a ]\n", "client_id must not be empty"},
		{base + "client_id: x\ntopics: [ a ]\nqos: 3\n", "qos must be 0, 1 or 2"},
		{base + "client_id: x\ntopics: [ a ]\nqos: -1\n", "qos must be 0, 1 or 2"},
		{base + "client_id: x\ntopics: [ 'a/#/b' ]\n", "topics: filter"},
		{base + "client_id: x\ntopics: [ a ]\nack_topic: acks\n", "ack_topic needs envelope"},
		{base + "client_id: x\ntopics: [ a ]\nenvelope: ingress\nack_topic: 'acks/#'\n", "ack_topic"},
		{base + "client_id: x\ntopics: [ a ]\nreceive_buffer_size: 0\n", "receive_buffer_size must be at least 1"},
		{base + "client_id: x\ntopics: [ a ]\nsession_replay_buffer_size: -1\n", "session_replay_buffer_size"},
		{base + "client_id: x\ntopics: [ a ]\nsession_replay_timeout: 0s\n", "session_replay_timeout must be positive"},
		// Enums are checked in code: --chilled skips the linter.
		{base + "client_id: x\ntopics: [ a ]\nenvelope: ingres\n", `envelope: "ingres" is not one of none, ingress, delivery`},
		{base + "client_id: x\ntopics: [ a ]\non_malformed: keep\n", `on_malformed: "keep" is not one of drop, flag`},
	} {
		conf, err := inputSpec().ParseYAML(tc.yaml, nil)
		if err == nil {
			_, err = parseSettings(conf)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config\n%s: error %v, want one containing %q", tc.yaml, err, tc.want)
		}
	}
}

// The routing metadata on a real broker, including a shared subscription.
func TestRoutingMetadata(t *testing.T) {
	b := startBroker(t)
	topics := []string{"a/#", "a/+/c", "a/b/c", "$share/grp/s/#"}
	ti := openInput(t, inputYAML(b.URL(), "routing", topics))
	want := map[string]string{"a/b/c": "a/b/c", "a/x/c": "a/+/c", "a/x": "a/#", "s/1": "$share/grp/s/#"}
	wantSub := map[string]string{}
	for k, v := range want {
		wantSub[k] = v
	}
	for _, topic := range []string{"a/b/c", "a/x/c", "a/x", "s/1"} {
		publish(t, b.URL(), topic, "p:"+topic)
	}
	// Mosquitto sends one copy per matching subscription, so a/b/c and a/x/c
	// may come more than once; every copy must carry the same routing.
	for reads := 0; len(want) > 0; reads++ {
		if reads == 8 {
			t.Fatalf("not received: %v", want)
		}
		msg, ack := ti.read()
		topic := meta(msg, metaTopic)
		if body(msg) != "p:"+topic {
			t.Fatalf("body %q on topic %q", body(msg), topic)
		}
		if got := meta(msg, metaSubscription); got != wantSub[topic] {
			t.Errorf("%s: mqtt_subscription = %q, want %q", topic, got, wantSub[topic])
		}
		delete(want, topic)
		if meta(msg, metaQoS) != "1" || meta(msg, metaRetained) != "false" || meta(msg, metaDuplicate) != "false" {
			t.Errorf("%s: qos %q retained %q duplicate %q", topic, meta(msg, metaQoS), meta(msg, metaRetained), meta(msg, metaDuplicate))
		}
		if id, err := strconv.Atoi(meta(msg, metaMessageID)); err != nil || id <= 0 || id > 65535 {
			t.Errorf("%s: mqtt_message_id = %q", topic, meta(msg, metaMessageID))
		}
		_ = ack(context.Background(), nil)
	}
}

// keepalive accepts Connect's integer form as seconds.
func TestKeepaliveIntegerIsSeconds(t *testing.T) {
	for yaml, want := range map[string]time.Duration{"keepalive: 30": 30 * time.Second, "keepalive: 45s": 45 * time.Second} {
		conf, err := inputSpec().ParseYAML("urls: [ tcp://127.0.0.1:1 ]\nclient_id: x\ntopics: [ a ]\n"+yaml+"\n", nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := parseSettings(conf)
		if err != nil {
			t.Fatalf("%s: %v", yaml, err)
		}
		if s.client.KeepAlive != want {
			t.Fatalf("%s: keepalive %s, want %s", yaml, s.client.KeepAlive, want)
		}
	}
}
