package mqttclient_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// user and password reach a mosquitto listener that requires them; a wrong
// password never gets a connection.
func TestUserAndPasswordAuthenticateAgainstMosquitto(t *testing.T) {
	eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
		pwfile := filepath.Join(t.TempDir(), "passwd")
		if out, err := exec.Command("mosquitto_passwd", "-c", "-b", pwfile, "plant", "s3cret").CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_passwd (part of Debian's mosquitto package): %v\n%s", err, out)
		}
		if err := os.Chmod(pwfile, 0o600); err != nil {
			t.Fatal(err)
		}
		// Global settings; a later allow_anonymous overrides the harness's.
		m := harness.StartMosquitto(t, harness.MosquittoOptions{Extra: fmt.Sprintf(
			"allow_anonymous false\npassword_file %s\n", pwfile)})
		url := m.URL()

		good := config(url)
		good.User, good.Password = "plant", "s3cret"
		c, err := startClient(good)
		if err != nil {
			t.Fatal(err)
		}
		defer closeClient(t, c)
		waitReady(t, c)

		for _, creds := range [][2]string{{"plant", "wrong"}, {"", ""}} {
			bad := config(url)
			bad.ClientID, bad.User, bad.Password = "mqttclient-refused", creds[0], creds[1]
			b, err := startClient(bad)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err = b.WaitReady(ctx)
			cancel()
			closeClient(t, b)
			if err == nil {
				t.Fatalf("a client with user %q and password %q got a connection", creds[0], creds[1])
			}
		}
	})
}
