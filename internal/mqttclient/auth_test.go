package mqttclient_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// user and password reach a mosquitto listener that requires them; a wrong
// password never gets a connection. On MQTT 5 the refusal is the CONNACK's
// reason code, named in the log.
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
			logs := &harness.LogBuffer{}
			log := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
			b, err := mqttclient.Start(bad, mqttclient.Handlers{}, mqttclient.Options{Logger: log})
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
			if bad.ProtocolVersion == mqttclient.V5 && !logs.Contains("CONNACK reason code 0x87: Not authorized") {
				t.Fatalf("no CONNACK reason code in the log:\n%s", logs)
			}
		}
	})
}
