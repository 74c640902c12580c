package mqttout_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttout"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// pipeline is an in-process Benthos stream whose only output is the
// reliable_mqtt_out under test; the test feeds it one message at a time.
type pipeline struct {
	t      *testing.T
	send   service.MessageHandlerFunc
	stream *service.Stream
	logs   *harness.LogBuffer
	done   chan error
}

// startPipeline runs output YAML (the body of `output:`) in a stream.
func startPipeline(t *testing.T, outputYAML string) *pipeline {
	t.Helper()
	return startTracedPipeline(t, outputYAML, "")
}

// startTracedPipeline is startPipeline with the tracer tracerYAML ("": none).
func startTracedPipeline(t *testing.T, outputYAML, tracerYAML string) *pipeline {
	t.Helper()
	sb := service.NewStreamBuilder()
	if tracerYAML != "" {
		if err := sb.SetTracerYAML(tracerYAML); err != nil {
			t.Fatalf("tracer config: %v", err)
		}
	}
	logs := &harness.LogBuffer{}
	sb.SetLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	send, err := sb.AddProducerFunc()
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.AddOutputYAML(outputYAML); err != nil {
		t.Fatalf("output config: %v", err)
	}
	stream, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	p := &pipeline{t: t, send: send, stream: stream, logs: logs, done: make(chan error, 1)}
	go func() { p.done <- stream.Run(context.Background()) }()
	t.Cleanup(func() { p.stop() })
	return p
}

// write sends one message through the pipeline and returns the output's
// verdict (nil once Write returned nil), bounded by timeout.
func (p *pipeline) write(timeout time.Duration, payload string, meta ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	msg := service.NewMessage([]byte(payload))
	for i := 0; i+1 < len(meta); i += 2 {
		msg.MetaSetMut(meta[i], meta[i+1])
	}
	return p.send(ctx, msg)
}

// stop shuts the stream down, bounded.
func (p *pipeline) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := p.stream.Stop(ctx); err != nil {
		p.t.Logf("stream stop: %v", err)
	}
}

// pendingIn opens an outbox file (not in use) and returns its pending count.
func pendingIn(t *testing.T, path string) int {
	t.Helper()
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatalf("reopen outbox: %v", err)
	}
	defer ob.Close()
	return ob.Stats().Pending
}
