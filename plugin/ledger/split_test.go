package ledger

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	ledgerpkg "github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// A message that passes dedup_ledger and is then split (unarchive) into 3
// parts for a reliable_mqtt_out on the ledger's file: every part is stored
// and the key is applied once. Each part shares the message's claim.
func TestMessageSplitAfterTheLedgerStoresEveryPart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.db")
	sb := service.NewStreamBuilder()
	logs := &harness.LogBuffer{}
	sb.SetLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	send, err := sb.AddProducerFunc()
	if err != nil {
		t.Fatal(err)
	}
	for _, y := range []string{
		"dedup_ledger:\n  path: " + path + "\n",
		"unarchive:\n  format: json_array\n",
	} {
		if err := sb.AddProcessorYAML(y); err != nil {
			t.Fatal(err)
		}
	}
	if err := sb.AddOutputYAML(`
reliable_mqtt_out:
  urls: [ "tcp://127.0.0.1:1" ]
  topic: out
  max_in_flight: 8
  outbox:
    path: ` + path + "\n"); err != nil {
		t.Fatal(err)
	}
	st, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- st.Run(context.Background()) }()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hctx, hooks := commit.WithHooks(ctx)
	msg := service.NewMessage([]byte(`[{"n":1},{"n":2},{"n":3}]`)).WithContext(hctx)
	msg.MetaSetMut("event_id", "batch-42")
	res := send(ctx, msg)
	hookErr := hooks.Run(ctx, res)
	t.Logf("pipeline result: %v, hooks: %v", res, hookErr)

	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	_ = st.Stop(sctx)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stream did not stop within 10s; the file is still open")
	}

	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := ob.Read(0, 100)
	_ = ob.Close()
	l, err := ledgerpkg.Open(path, ledgerpkg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	applied, _, _, _ := l.Lookup(claims.Key{ID: "batch-42"})
	_ = l.Close()
	t.Logf("key batch-42 applied on disk: %v", applied)
	for _, r := range recs {
		t.Logf("outbox record seq=%d id=%s payload=%s", r.Seq, r.EventID, r.Payload)
	}
	if res != nil || hookErr != nil {
		t.Fatalf("pipeline result %v, hooks %v", res, hookErr)
	}
	if len(recs) != 3 {
		t.Errorf("source acknowledged with success, but only %d of 3 parts are in the outbox", len(recs))
	}
	if !applied {
		t.Error("the key is not applied although its parts are stored")
	}
}
