package ledger

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttout"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// stream is an in-process Benthos stream fed by the test. send plays
// reliable_mqtt_in: it gives each message a delivery hook list, waits for
// the pipeline's verdict and runs the hooks with it, the way the input does
// before its PUBACK.
type stream struct {
	t      *testing.T
	send   service.MessageHandlerFunc
	stream *service.Stream
	logs   *harness.LogBuffer
	done   chan error
}

func startStream(t *testing.T, processorYAML, outputYAML string) *stream {
	t.Helper()
	sb := service.NewStreamBuilder()
	logs := &harness.LogBuffer{}
	sb.SetLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	send, err := sb.AddProducerFunc()
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.AddProcessorYAML(processorYAML); err != nil {
		t.Fatalf("processor config: %v", err)
	}
	if err := sb.AddOutputYAML(outputYAML); err != nil {
		t.Fatalf("output config: %v", err)
	}
	st, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	s := &stream{t: t, send: send, stream: st, logs: logs, done: make(chan error, 1)}
	go func() { s.done <- st.Run(context.Background()) }()
	t.Cleanup(s.stop)
	return s
}

func (s *stream) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.stream.Stop(ctx)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.t.Error("stream did not stop within 10s")
	}
}

// deliver sends one message with hooks (as reliable_mqtt_in would) and
// returns the pipeline's result and the hooks' result.
func (s *stream) deliver(payload string, meta ...string) (result, hookErr error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hctx, hooks := commit.WithHooks(ctx)
	msg := newMsg(payload, meta...).WithContext(hctx)
	result = s.send(ctx, msg)
	return result, hooks.Run(ctx, result)
}

// sendPlain sends a message without hooks (any other input).
func (s *stream) sendPlain(payload string, meta ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.send(ctx, newMsg(payload, meta...))
}

func newMsg(payload string, meta ...string) *service.Message {
	msg := service.NewMessage([]byte(payload))
	for i := 0; i+1 < len(meta); i += 2 {
		msg.MetaSetMut(meta[i], meta[i+1])
	}
	return msg
}

// newTestProcessor builds a dedup_ledger from YAML, as Benthos would.
func newTestProcessor(t *testing.T, yaml string) *processor {
	t.Helper()
	conf, err := processorSpec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProcessor(conf, service.MockResources())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// inFlight is one message handed to the processor with its own hooks.
type inFlight struct {
	hooks *commit.Hooks
	out   []service.MessageBatch
	err   error
	done  chan struct{}
}

// process runs ProcessBatch on one message in the background.
func process(p *processor, payload, eventID string) *inFlight {
	ctx, hooks := commit.WithHooks(context.Background())
	f := &inFlight{hooks: hooks, done: make(chan struct{})}
	msg := newMsg(payload, "event_id", eventID).WithContext(ctx)
	go func() {
		defer close(f.done)
		f.out, f.err = p.ProcessBatch(ctx, service.MessageBatch{msg})
	}()
	return f
}

func (f *inFlight) wait(t *testing.T) *inFlight {
	t.Helper()
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		t.Fatal("ProcessBatch did not return within 10s")
	}
	if f.err != nil {
		t.Fatal(f.err)
	}
	return f
}

func (f *inFlight) returned() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// passed reports whether the message came out without an error flag and
// without the duplicate or conflict flags.
func (f *inFlight) passed() bool {
	if len(f.out) == 0 || len(f.out[0]) == 0 {
		return false
	}
	m := f.out[0][0]
	_, dup := m.MetaGetMut(metaDuplicate)
	_, conflict := m.MetaGetMut(metaConflict)
	return m.GetError() == nil && !dup && !conflict
}

func (f *inFlight) msg(t *testing.T) *service.Message {
	t.Helper()
	if len(f.out) != 1 || len(f.out[0]) != 1 {
		t.Fatalf("want one message out, got %v", f.out)
	}
	return f.out[0][0]
}

func (f *inFlight) ack(t *testing.T, result error) {
	t.Helper()
	if err := f.hooks.Run(context.Background(), result); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func countOf(payloads [][]byte, want string) int {
	n := 0
	for _, p := range payloads {
		if string(p) == want {
			n++
		}
	}
	return n
}
