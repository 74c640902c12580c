package benthoslog_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/benthoslog"
	"github.com/reliable-mqtt/reliable-mqtt/internal/embedded"
)

// syncBuffer is written by broker goroutines and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
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
// that logger's format, and a client with keepalive 0 is not a warning.
func TestEmbeddedBrokerLogsThroughBenthosLogger(t *testing.T) {
	buf := &syncBuffer{}
	log := service.NewLoggerFromSlog(slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})))

	b, err := embedded.Acquire("embedded://?dir="+t.TempDir(), embedded.WithLog(benthoslog.Handler(log)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()

	o := paho.NewClientOptions().AddBroker(b.ClientURL()).SetClientID("keepalive-off").SetKeepAlive(0).SetAutoReconnect(false)
	c := paho.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	c.Disconnect(100)

	var started, keepalive map[string]any
	deadline := time.Now().Add(15 * time.Second)
	for keepalive == nil && time.Now().Before(deadline) {
		for _, r := range buf.records(t) {
			switch r["msg"] {
			case "embedded broker started":
				started = r
			case "client keepalive is below minimum recommended value and may exhibit connection instability":
				keepalive = r
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if started == nil {
		t.Fatalf("no 'embedded broker started' line through the given logger; got:\n%v", buf.records(t))
	}
	if started["component"] != "embedded_broker" || started["level"] != "INFO" {
		t.Fatalf("started line lost its attributes or level: %v", started)
	}
	if keepalive == nil {
		t.Fatalf("no keepalive line for the keepalive-0 client at debug level; got:\n%v", buf.records(t))
	}
	if keepalive["level"] != "DEBUG" || fmt.Sprint(keepalive["keepalive"]) != "0" {
		t.Fatalf("keepalive-0 client logged as %v, want DEBUG with keepalive=0", keepalive)
	}
}
