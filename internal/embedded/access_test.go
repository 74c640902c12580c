package embedded

import (
	"crypto/tls"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"golang.org/x/crypto/bcrypt"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// accessClient connects to url as user; it returns the connect error.
func accessClient(t *testing.T, url, id, user, pass string, tlsConf *tls.Config, onMsg paho.MessageHandler) (paho.Client, error) {
	t.Helper()
	o := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetUsername(user).SetPassword(pass).
		SetAutoReconnect(false).SetConnectTimeout(5 * time.Second).SetTLSConfig(tlsConf)
	if onMsg != nil {
		o.SetDefaultPublishHandler(onMsg)
	}
	c := paho.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(10 * time.Second) {
		t.Fatalf("%s: no CONNACK", id)
	}
	if tok.Error() == nil {
		t.Cleanup(func() { c.Disconnect(100) })
	}
	return c, tok.Error()
}

// The listen listener with users, acl and TLS: a client that trusts the CA
// connects over TLS; an unknown user and a wrong password are refused; a
// user (mosquitto_passwd $7$ hash) may publish on its data topic but not on
// the ACK topic, which only the bridge user (bcrypt hash) may write.
func TestListenerRequiresLoginAppliesACLsAndServesTLS(t *testing.T) {
	dir := t.TempDir()
	pool, _, certFile, keyFile := harness.WriteTestPKI(t)
	usersFile := filepath.Join(dir, "users")
	if out, err := exec.Command("mosquitto_passwd", "-b", "-c", usersFile, "sensor", "sensor-pw").CombinedOutput(); err != nil {
		t.Skipf("mosquitto_passwd: %v %s", err, out)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte("bridge-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(usersFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("bridge:" + string(hash) + "\n")
	_ = f.Close()
	aclFile := filepath.Join(dir, "acl.yaml")
	acl := "sensor:\n  write: [ reliable/ingress ]\n  read: [ reliable/acks ]\nbridge:\n  write: [ reliable/acks ]\n  read: [ reliable/# ]\n"
	if err := os.WriteFile(aclFile, []byte(acl), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	b, err := Acquire("embedded://?dir=" + filepath.Join(dir, "broker") + "&listen=" + addr +
		"&users=" + usersFile + "&acl=" + aclFile + "&tls_cert=" + certFile + "&tls_key=" + keyFile)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	url := "ssl://" + addr
	tlsConf := &tls.Config{RootCAs: pool}

	if _, err := accessClient(t, url, "stranger", "nobody", "x", tlsConf, nil); err == nil {
		t.Fatal("an unknown user was let in")
	}
	if _, err := accessClient(t, url, "guesser", "sensor", "wrong", tlsConf, nil); err == nil {
		t.Fatal("a wrong password was let in")
	}

	var mu sync.Mutex
	var got []string
	watcher, err := accessClient(t, url, "watcher", "bridge", "bridge-pw", tlsConf, func(_ paho.Client, m paho.Message) {
		mu.Lock()
		got = append(got, m.Topic()+" "+string(m.Payload()))
		mu.Unlock()
	})
	if err != nil {
		t.Fatalf("the bridge user over TLS with the CA: %v", err)
	}
	if tok := watcher.Subscribe("reliable/#", 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	// The ACK topic is not the sensor's: mochi drops the PUBLISH and the
	// connection (MQTT 3.1.1 has no way to refuse a single PUBLISH).
	sensor, err := accessClient(t, url, "sensor-1", "sensor", "sensor-pw", tlsConf, nil)
	if err != nil {
		t.Fatalf("sensor ($7$ hash): %v", err)
	}
	sensor.Publish("reliable/acks", 1, false, "forged-ack").WaitTimeout(5 * time.Second)
	sensor, err = accessClient(t, url, "sensor-2", "sensor", "sensor-pw", tlsConf, nil)
	if err != nil {
		t.Fatalf("sensor again: %v", err)
	}
	if tok := sensor.Publish("reliable/ingress", 1, false, "reading"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("the sensor's own topic: %v", tok.Error())
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	// Had the forged ACK passed, it would have arrived before the reading.
	if len(got) != 1 || got[0] != "reliable/ingress reading" {
		t.Fatalf("watcher got %q, want only the sensor's ingress message (its ACK-topic publish refused)", got)
	}

	plain, err := accessClient(t, "tcp://"+addr, "plain", "bridge", "bridge-pw", nil, nil)
	if err == nil {
		plain.Disconnect(0)
		t.Fatal("a plain TCP client connected to the TLS listener")
	}
}
