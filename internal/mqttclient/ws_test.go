package mqttclient_test

import (
	"crypto/tls"
	"fmt"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// wsBroker starts a mochi broker whose only listener is MQTT over
// WebSocket on 127.0.0.1 (TLS when tlsConf is set); mosquitto as packaged
// here has no WebSocket support.
func wsBroker(t *testing.T, tlsConf *tls.Config) string {
	t.Helper()
	srv := mqtt.New(&mqtt.Options{})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	ws := listeners.NewWebsocket(listeners.Config{ID: "ws", Address: addr, TLSConfig: tlsConf})
	if err := srv.AddListener(ws); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return ws.Protocol() + "://" + addr + "/mqtt"
}

// ws:// and wss:// carry both protocols; a v5 round trip keeps its
// properties and binary payload.
func TestWebSocketURLs(t *testing.T) {
	pool, _, certFile, keyFile := harness.WriteTestPKI(t)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, secure := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", secure), func(t *testing.T) {
			var serverTLS, clientTLS *tls.Config
			if secure {
				serverTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
				clientTLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
			}
			url := wsBroker(t, serverTLS)
			eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
				sub, pub := config(url), config(url)
				// One broker serves both protocols: distinct sessions.
				sub.ClientID, pub.ClientID = "ws-sub-"+sub.ProtocolVersion, "ws-pub-"+pub.ProtocolVersion
				sub.TLS, pub.TLS = clientTLS, clientTLS
				got := newInbox()
				waitReady(t, startWith(t, sub, map[string]byte{"ws/#": 1}, got, mqttclient.Options{}))
				conn := waitReady(t, startWith(t, pub, nil, nil, mqttclient.Options{}))
				payload := []byte{0x00, 0xff, 0xfe, 'w', 's'}
				var props *mqttmsg.Properties
				if pub.ProtocolVersion == mqttclient.V5 {
					props = &mqttmsg.Properties{User: []mqttmsg.UserProperty{{Key: "event_id", Value: "ws-1"}}}
				}
				for range 50 {
					publish(t, conn, mqttmsg.Publication{Event: mqttmsg.Event{Topic: "ws/t", Payload: payload, Props: props}, QoS: 1})
				}
				for _, msg := range got.waitFor(t, 50, 10*time.Second) {
					if string(msg.Payload()) != string(payload) {
						t.Fatalf("payload %x, want %x", msg.Payload(), payload)
					}
					if id, _ := msg.Properties().Get("event_id"); props != nil && id != "ws-1" {
						t.Fatalf("user property event_id %q, want ws-1", id)
					}
				}
			})
		})
	}
}
