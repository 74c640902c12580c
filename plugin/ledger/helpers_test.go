package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttout"
)

// newTestProcessor builds a dedup_ledger from YAML, as Benthos would.
func newTestProcessor(t *testing.T, yaml string) *processor {
	t.Helper()
	conf, err := processorSpec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := parseSettings(conf)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProcessor(s, service.MockResources())
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
	msg := streamtest.Message(payload, "event_id", eventID).WithContext(ctx)
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
