package ledger

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	ledgerpkg "github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
)

// A message that passes dedup_ledger and is then split (unarchive) into 3
// parts for a reliable_mqtt_out on the ledger's file: every part is stored
// and the key is applied once. Each part shares the message's claim.
func TestMessageSplitAfterTheLedgerStoresEveryPart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.db")
	st := streamtest.Start(t, `
reliable_mqtt_out:
  urls: [ "tcp://127.0.0.1:1" ]
  topic: out
  max_in_flight: 8
  outbox:
    path: `+path+"\n",
		"dedup_ledger:\n  path: "+path+"\n",
		"unarchive:\n  format: json_array\n",
	)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, hookErr := st.Deliver(ctx, streamtest.Message(`[{"n":1},{"n":2},{"n":3}]`, "event_id", "batch-42"))
	t.Logf("pipeline result: %v, hooks: %v", res, hookErr)

	st.Stop()
	if t.Failed() {
		t.FailNow() // the stream did not end: the file is still open
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
