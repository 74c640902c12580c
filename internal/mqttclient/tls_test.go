package mqttclient_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// ssl:// URLs with a tls config reach a TLS listener of mosquitto, and a
// client that does not trust the server's CA never gets a connection.
func TestTLSConnectsToMosquittoAndRefusesAnUntrustedServer(t *testing.T) {
	eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
		pool, caFile, certFile, keyFile := harness.WriteTestPKI(t)
		tlsPort := harness.FreePort(t)
		m := harness.StartMosquitto(t, harness.MosquittoOptions{Extra: fmt.Sprintf(
			"listener %d 127.0.0.1\ncafile %s\ncertfile %s\nkeyfile %s\n", tlsPort, caFile, certFile, keyFile)})
		url := fmt.Sprintf("ssl://127.0.0.1:%d", tlsPort)

		cfg := config(url)
		cfg.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		got := make(chan string, 1)
		c, err := mqttclient.Start(cfg, mqttclient.Handlers{
			OnConnect: func(ctx context.Context, conn mqttclient.Conn) error {
				return conn.Subscribe(ctx, map[string]byte{"tls/t": 1})
			},
			OnMessage: func(_ mqttclient.Conn, msg mqttmsg.Message) {
				select {
				case got <- string(msg.Payload()):
				default:
				}
			},
		}, mqttclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer closeClient(t, c)
		waitReady(t, c)
		harness.Publish(t, m.URL(), "tls/t", harness.Payloads("over tls")) // published in plain TCP, read over TLS
		select {
		case p := <-got:
			if p != "over tls" {
				t.Fatalf("got %q", p)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("nothing arrived over the TLS connection")
		}

		// Without the CA the handshake fails and the client keeps retrying.
		untrusted := config(url)
		untrusted.ClientID = "mqttclient-untrusted"
		untrusted.TLS = &tls.Config{RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12}
		u, err := mqttclient.Start(untrusted, mqttclient.Handlers{}, mqttclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer closeClient(t, u)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := u.WaitReady(ctx); err == nil {
			t.Fatal("a client connected to a server whose certificate it cannot verify")
		}
	})
}
