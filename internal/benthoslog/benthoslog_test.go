package benthoslog_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/benthoslog"
	"github.com/reliable-mqtt/reliable-mqtt/internal/embedded"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// records parses the JSON lines written so far.
func records(t *testing.T, buf *harness.LogBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not the configured JSON format: %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// The embedded broker's lines go through the Benthos logger it was given, in
// that logger's format. A keepalive that needs no action is not a warning:
// 0 (off on purpose) or 5 s (our default, which mochi warns about while
// naming it as its recommendation); 3 s is below it and stays a warning.
// mochi's own start-up lines are debug; ours stays info.
func TestEmbeddedBrokerLogsThroughBenthosLogger(t *testing.T) {
	buf := &harness.LogBuffer{}
	log := service.NewLoggerFromSlog(slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})))

	b, err := embedded.Acquire("embedded://?dir="+t.TempDir(), embedded.WithLog(benthoslog.Handler(log)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()

	want := map[string]string{"0": "DEBUG", "5": "DEBUG", "3": "WARN"}
	for ka := range want {
		secs, _ := strconv.Atoi(ka)
		o := paho.NewClientOptions().AddBroker(b.ClientURL()).SetClientID("keepalive-" + ka).
			SetKeepAlive(time.Duration(secs) * time.Second).SetAutoReconnect(false)
		c := paho.NewClient(o)
		if tok := c.Connect(); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
			t.Fatalf("connect: %v", tok.Error())
		}
		c.Disconnect(100)
	}

	var started, mochiStarted map[string]any
	keepalive := map[string]map[string]any{}
	deadline := time.Now().Add(15 * time.Second)
	for len(keepalive) < len(want) && time.Now().Before(deadline) {
		for _, r := range records(t, buf) {
			switch r["msg"] {
			case "embedded broker started":
				started = r
			case "mochi mqtt server started":
				mochiStarted = r
			case "client keepalive is below minimum recommended value and may exhibit connection instability":
				keepalive[fmt.Sprint(r["keepalive"])] = r
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if started == nil {
		t.Fatalf("no 'embedded broker started' line through the given logger; got:\n%v", records(t, buf))
	}
	if started["component"] != "embedded_broker" || started["level"] != "INFO" {
		t.Fatalf("started line lost its attributes or level: %v", started)
	}
	if mochiStarted == nil || mochiStarted["level"] != "DEBUG" {
		t.Fatalf("mochi's own start-up line is %v, want it at DEBUG", mochiStarted)
	}
	for ka, level := range want {
		r := keepalive[ka]
		if r == nil {
			t.Fatalf("no keepalive line for the keepalive-%s client; got:\n%v", ka, records(t, buf))
		}
		if r["level"] != level {
			t.Errorf("keepalive-%s client logged as %v, want %s", ka, r, level)
		}
	}
}

// The configured level applies to the broker's lines: a logger at WARN
// shows none of its startup lines.
func TestEmbeddedBrokerFollowsConfiguredLevel(t *testing.T) {
	buf := &harness.LogBuffer{}
	log := service.NewLoggerFromSlog(slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	b, err := embedded.Acquire("embedded://?dir="+t.TempDir(), embedded.WithLog(benthoslog.Handler(log)))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	if buf.Contains("embedded broker started") {
		t.Fatalf("an info line passed a WARN-level logger:\n%s", buf.String())
	}
}
