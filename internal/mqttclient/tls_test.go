package mqttclient_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// writeTestPKI makes a CA and a server certificate for 127.0.0.1 and
// returns the CA pool and the PEM file paths for mosquitto.
func writeTestPKI(t *testing.T) (pool *x509.CertPool, caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "reliable-mqtt test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	return pool, write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}

// ssl:// URLs with a tls config reach a TLS listener of mosquitto, and a
// client that does not trust the server's CA never gets a connection.
func TestTLSConnectsToMosquittoAndRefusesAnUntrustedServer(t *testing.T) {
	pool, caFile, certFile, keyFile := writeTestPKI(t)
	tlsPort := harness.FreePort(t)
	m := harness.StartMosquitto(t, harness.MosquittoOptions{Extra: fmt.Sprintf(
		"listener %d 127.0.0.1\ncafile %s\ncertfile %s\nkeyfile %s\n", tlsPort, caFile, certFile, keyFile)})
	url := fmt.Sprintf("ssl://127.0.0.1:%d", tlsPort)

	cfg := config(url)
	cfg.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	got := make(chan string, 1)
	c, err := mqttclient.Start(cfg, mqttclient.Handlers{
		OnConnect: func(ctx context.Context, conn *mqttclient.Conn) error {
			return conn.Subscribe(ctx, map[string]byte{"tls/t": 1})
		},
		OnMessage: func(_ *mqttclient.Conn, msg paho.Message) {
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
}
