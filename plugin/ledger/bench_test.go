package ledger

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/benchtest"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
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
	var procs []string
	if processors != "" {
		procs = append(procs, processors)
	}
	st := streamtest.StartQuiet(b, output, procs...)
	payload := []byte(`{"producer":"bench","delta":1}`)
	benchtest.Concurrent(b, 64, func(i int64) error {
		msg := service.NewMessage(payload)
		msg.MetaSetMut("event_id", fmt.Sprintf("e%d", i))
		if res, err := st.Deliver(context.Background(), msg); err != nil || res != nil {
			return fmt.Errorf("result %v, hooks %v", res, err)
		}
		return nil
	})
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
