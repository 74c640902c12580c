package mqttout_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// storedIDs opens an outbox file (not in use) and returns its records' event
// IDs, oldest first.
func storedIDs(t *testing.T, path string) []string {
	t.Helper()
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatalf("reopen outbox: %v", err)
	}
	defer ob.Close()
	recs, err := ob.Read(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.EventID)
	}
	return ids
}

// TestBatchFailsOnlyItsBadMessageAndStoresTheRestInOrder: one batch of ten
// with an invalid event ID in the middle; the nine others are stored in
// their order and only the bad one is reported failed.
func TestBatchFailsOnlyItsBadMessageAndStoresTheRestInOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	p := streamtest.StartBatches(t, outputConf(unreachable, path))

	var batch service.MessageBatch
	var want []string
	for i := 0; i < 10; i++ {
		msg := service.NewMessage([]byte(fmt.Sprint(i)))
		id := fmt.Sprintf("ev-%d", i)
		if i == 4 {
			id = "not valid" // a space: refused before anything is stored
		} else {
			want = append(want, id)
		}
		msg.MetaSetMut("id", id)
		msg.MetaSetMut("n", "x")
		batch = append(batch, msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := p.SendBatch(ctx, batch)
	if err == nil || !strings.Contains(err.Error(), "not valid") {
		t.Fatalf("batch with one invalid event ID: got %v, want an error naming it", err)
	}
	if !strings.Contains(err.Error(), "1 of 10 messages failed") {
		t.Fatalf("got %v, want the batch error to count 1 of 10 failed", err)
	}
	p.Stop()
	got := storedIDs(t, path)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("stored %v, want %v", got, want)
	}
}

// TestDirectModeBatchReturnsOnceEveryMessageIsACKed: without an outbox a
// batch is done only once each of its messages has its end-to-end ACK.
func TestDirectModeBatchReturnsOnceEveryMessageIsACKed(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	acker := harness.StartAcker(t, m.URL(), "direct/data", "direct/acks", nil)
	p := streamtest.StartBatches(t, fmt.Sprintf(`
reliable_mqtt_out:
  urls: [ %q ]
  topic: test/direct
  confirm: end_to_end
  data_topic: direct/data
  ack_topic: direct/acks
  outbox:
    enabled: false
`, m.URL()))
	var batch service.MessageBatch
	for i := 0; i < 5; i++ {
		batch = append(batch, service.NewMessage([]byte(fmt.Sprintf(`{"n":%d}`, i))))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.SendBatch(ctx, batch); err != nil {
		t.Fatalf("direct batch with an ACKing consumer: %v", err)
	}
	if n := len(acker.Seen()); n < 5 {
		t.Fatalf("the batch returned when the consumer had %d of its 5 messages", n)
	}
}

// TestBatchingPolicyAcknowledgesEveryWriteAfterItIsStored: with a batching
// policy every write is acknowledged, and each acknowledged write is in the
// file.
func TestBatchingPolicyAcknowledgesEveryWriteAfterItIsStored(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	p := streamtest.Start(t, outputConf(unreachable, path, "batching", "{ count: 4, period: 20ms }", "max_in_flight", "4"))
	const n = 10
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Write(30*time.Second, fmt.Sprint(i), "n", "x", "id", fmt.Sprintf("ev-%d", i))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	p.Stop()
	if got := storedIDs(t, path); len(got) != n {
		t.Fatalf("stored %d records (%v), want %d", len(got), got, n)
	}
}
