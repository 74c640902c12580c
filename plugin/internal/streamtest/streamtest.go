// Package streamtest runs an in-process Benthos stream that a test feeds
// one message at a time: the plugins' tests and benchmarks drive their
// components through YAML with it, the way a user's config would. Only
// tests import it.
package streamtest

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// stopWithin bounds Stop: the stream's shutdown, then Run's return.
const stopWithin = 15 * time.Second

// Stream is a running stream: producer → processors → output.
type Stream struct {
	// Send hands one message to the stream and returns the pipeline's
	// verdict (nil once the output acknowledged it). Nil on a stream from
	// StartBatches.
	Send service.MessageHandlerFunc
	// SendBatch hands a whole batch to a stream from StartBatches and
	// returns its verdict (a service.BatchError names the failed messages).
	SendBatch service.MessageBatchHandlerFunc
	// Logs holds everything the stream logged, debug level included.
	Logs *harness.LogBuffer

	t      testing.TB
	stream *service.Stream
	ended  chan struct{} // closed when Run returned, runErr set
	runErr error
	once   sync.Once
}

// Start builds and runs a stream with output (the YAML body of `output:`)
// and processors (one processor's YAML each, in order). It stops at the
// test's cleanup, if Stop was not called before.
func Start(t testing.TB, output string, processors ...string) *Stream {
	t.Helper()
	logs := &harness.LogBuffer{}
	return start(t, logs, debugTo(logs), false, "", output, processors)
}

// StartTraced is Start with the tracer tracer (the YAML body of `tracer:`).
func StartTraced(t testing.TB, tracer, output string, processors ...string) *Stream {
	t.Helper()
	logs := &harness.LogBuffer{}
	return start(t, logs, debugTo(logs), false, tracer, output, processors)
}

// StartBatches is Start with a producer of whole batches: the stream is
// fed through SendBatch.
func StartBatches(t testing.TB, output string, processors ...string) *Stream {
	t.Helper()
	logs := &harness.LogBuffer{}
	return start(t, logs, debugTo(logs), true, "", output, processors)
}

// StartQuiet is Start with the logs discarded (Logs stays empty): for
// benchmarks, where writing the debug lines would cost several times the
// pipeline's own work.
func StartQuiet(t testing.TB, output string, processors ...string) *Stream {
	t.Helper()
	return start(t, &harness.LogBuffer{}, slog.NewTextHandler(io.Discard, nil), false, "", output, processors)
}

// StartConfig builds and runs a whole stream from yaml, a config file's
// body (input, pipeline, output, tracer), logging at debug level into Logs
// (Send is nil: the config has its own input). It stops at the test's
// cleanup, if Stop was not called before.
func StartConfig(t testing.TB, yaml string) *Stream {
	t.Helper()
	logs := &harness.LogBuffer{}
	return startConfig(t, logs, debugTo(logs), yaml)
}

// StartConfigQuiet is StartConfig with the logs discarded, for benchmarks
// (as StartQuiet).
func StartConfigQuiet(t testing.TB, yaml string) *Stream {
	t.Helper()
	return startConfig(t, &harness.LogBuffer{}, slog.DiscardHandler, yaml)
}

func startConfig(t testing.TB, logs *harness.LogBuffer, h slog.Handler, yaml string) *Stream {
	t.Helper()
	sb := service.NewStreamBuilder()
	sb.SetLogger(slog.New(h))
	if err := sb.SetYAML(yaml); err != nil {
		t.Fatalf("stream config: %v\n%s", err, yaml)
	}
	st, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	return run(t, &Stream{Logs: logs, t: t, ended: make(chan struct{}), stream: st})
}

// run runs s's stream until it ends, and stops it at the test's cleanup.
func run(t testing.TB, s *Stream) *Stream {
	go func() {
		s.runErr = s.stream.Run(context.Background())
		close(s.ended)
	}()
	t.Cleanup(s.Stop)
	return s
}

// debugTo writes every log line, debug level included, to logs.
func debugTo(logs *harness.LogBuffer) slog.Handler {
	return slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})
}

func start(t testing.TB, logs *harness.LogBuffer, h slog.Handler, batches bool, tracer, output string, processors []string) *Stream {
	t.Helper()
	sb := service.NewStreamBuilder()
	sb.SetLogger(slog.New(h))
	if tracer != "" {
		if err := sb.SetTracerYAML(tracer); err != nil {
			t.Fatalf("tracer config: %v", err)
		}
	}
	s := &Stream{Logs: logs, t: t, ended: make(chan struct{})}
	var err error
	if batches {
		s.SendBatch, err = sb.AddBatchProducerFunc()
	} else {
		s.Send, err = sb.AddProducerFunc()
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range processors {
		if err := sb.AddProcessorYAML(p); err != nil {
			t.Fatalf("processor config: %v", err)
		}
	}
	if err := sb.AddOutputYAML(output); err != nil {
		t.Fatalf("output config: %v", err)
	}
	st, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	s.stream = st
	return run(t, s)
}

// Stop shuts the stream down and waits until it ended, so that the files
// its components held are closed; a stream that does not end in time
// fails the test. Calls after the first do nothing.
func (s *Stream) Stop() {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopWithin)
		defer cancel()
		if err := s.stream.Stop(ctx); err != nil {
			s.t.Logf("stream stop: %v", err)
		}
		select {
		case <-s.ended:
		case <-time.After(stopWithin):
			s.t.Errorf("the stream did not end within %s of its stop", stopWithin)
		}
	})
}

// Ended is closed once the stream ended, by Stop or by itself (a
// component that refused to start); Err is then its error.
func (s *Stream) Ended() <-chan struct{} { return s.ended }

// Err waits until the stream ended and returns why: nil after Stop.
func (s *Stream) Err() error {
	<-s.ended
	return s.runErr
}

// Write sends a message (payload, metadata as key, value pairs) without
// delivery hooks, as any input but reliable_mqtt_in would, and returns the
// verdict; it gives up after timeout.
func (s *Stream) Write(timeout time.Duration, payload string, meta ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return s.Send(ctx, Message(payload, meta...))
}

// Deliver sends msg the way reliable_mqtt_in does: with a delivery hook
// list in its context, then runs the hooks with the pipeline's verdict, as
// the input does before its PUBACK. It returns the verdict and the hooks'
// error.
func (s *Stream) Deliver(ctx context.Context, msg *service.Message) (result, hookErr error) {
	hctx, hooks := commit.WithHooks(ctx)
	result = s.Send(ctx, msg.WithContext(hctx))
	return result, hooks.Run(ctx, result)
}

// Message is a message with payload and metadata given as key, value pairs.
func Message(payload string, meta ...string) *service.Message {
	msg := service.NewMessage([]byte(payload))
	for i := 0; i+1 < len(meta); i += 2 {
		msg.MetaSetMut(meta[i], meta[i+1])
	}
	return msg
}
