package mqttclient

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// A CONNACK with a reason code of 0x80 or more fails the attempt with a
// *ReasonCodeError naming the code and the protocol's reason.
func TestV5ConnackRefusalIsAReasonCodeError(t *testing.T) {
	pwfile := filepath.Join(t.TempDir(), "passwd")
	if out, err := exec.Command("mosquitto_passwd", "-c", "-b", pwfile, "plant", "s3cret").CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_passwd (part of Debian's mosquitto package): %v\n%s", err, out)
	}
	if err := os.Chmod(pwfile, 0o600); err != nil {
		t.Fatal(err)
	}
	m := harness.StartMosquitto(t, harness.MosquittoOptions{Extra: fmt.Sprintf("allow_anonymous false\npassword_file %s\n", pwfile)})
	cfg := Config{
		URLs: []string{m.URL()}, ClientID: "v5-refused", User: "plant", Password: "wrong",
		KeepAlive: 5 * time.Second, ConnectTimeout: 2 * time.Second, ProtocolVersion: V5,
		Reconnect: Backoff{Initial: time.Second, Max: time.Second},
	}
	c, err := newClient(cfg, Handlers{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.dialV5(1, make(chan struct{}))
	var rc *ReasonCodeError
	if !errors.As(err, &rc) || rc.Packet != "CONNACK" || rc.Code < 0x80 || rc.Reason == "" {
		t.Fatalf("wrong password: %v, want a CONNACK ReasonCodeError with a reason", err)
	}
	t.Logf("mosquitto refused with: %v", err)

	c.cfg.Password = "s3cret"
	conn, err := c.dialV5(2, make(chan struct{}))
	if err != nil {
		t.Fatalf("right password: %v", err)
	}
	conn.disconnect(true)
}
