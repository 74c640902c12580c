package ledger

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttout"
)

// benchPipeline pushes b.N messages with distinct event IDs through a
// Benthos stream (producer → processors → drop) from 64 concurrent senders;
// each sender plays reliable_mqtt_in: hooks on the message, run after the
// ack. With the ledger, every message is claimed in the processor and its
// key committed (fsync'd, group-committed) by its delivery hook.
func benchPipeline(b *testing.B, processors string) {
	benchPipelineTo(b, processors, "drop: {}")
}

// benchPipelineTo is benchPipeline with a chosen output.
func benchPipelineTo(b *testing.B, processors, output string) {
	sb := service.NewStreamBuilder()
	sb.SetLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	send, err := sb.AddProducerFunc()
	if err != nil {
		b.Fatal(err)
	}
	if processors != "" {
		if err := sb.AddProcessorYAML(processors); err != nil {
			b.Fatal(err)
		}
	}
	if err := sb.AddOutputYAML(output); err != nil {
		b.Fatal(err)
	}
	st, err := sb.Build()
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- st.Run(context.Background()) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = st.Stop(ctx)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			b.Error("stream did not stop within 10s")
		}
	}()

	const senders = 64
	var next atomic.Int64
	var wg sync.WaitGroup
	payload := []byte(`{"producer":"bench","delta":1}`)
	b.ResetTimer()
	start := time.Now()
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				ctx, hooks := commit.WithHooks(context.Background())
				msg := service.NewMessage(payload)
				msg.MetaSetMut("event_id", fmt.Sprintf("e%d", i))
				res := send(ctx, msg.WithContext(ctx))
				if err := hooks.Run(ctx, res); err != nil || res != nil {
					b.Error(res, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkLedger compares the same pipeline with and without dedup_ledger
// in one run.
func BenchmarkLedger(b *testing.B) {
	b.Run("no-ledger", func(b *testing.B) { benchPipeline(b, "") })
	b.Run("dedup_ledger", func(b *testing.B) {
		benchPipeline(b, fmt.Sprintf("dedup_ledger:\n  path: %s\n", filepath.Join(b.TempDir(), "l.db")))
	})
}

// BenchmarkLedgerWithDurableOutput compares a relay whose effect is durable
// — reliable_mqtt_out appending to its fsync'd outbox (the broker is
// unreachable, so only the append is measured) — with and without a
// dedup_ledger sharing the outbox's file, in one run. This is the ledger's
// real cost: its key rides in the outbox's own transaction.
func BenchmarkLedgerWithDurableOutput(b *testing.B) {
	output := func(path string) string {
		return fmt.Sprintf(`reliable_mqtt_out:
  urls: [ "tcp://127.0.0.1:1" ]
  topic: bench/out
  event_id: '${! meta("event_id") }'
  outbox: { path: %q }
`, path)
	}
	b.Run("no-ledger", func(b *testing.B) {
		benchPipelineTo(b, "", output(filepath.Join(b.TempDir(), "relay.db")))
	})
	b.Run("dedup_ledger", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "relay.db")
		benchPipelineTo(b, fmt.Sprintf("dedup_ledger:\n  path: %s\n", path), output(path))
	})
}
