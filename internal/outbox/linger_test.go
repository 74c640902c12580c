package outbox

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// A removal alone is held for an append to share its fsync; an append, and
// a removal that appends wait for (the outbox is full), commit at once.
func TestRemovalWaitsForAnAppendUnlessAppendsWaitForItsSpace(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "out.db"), Options{MaxPending: 1})
	removal := []*request{{seqs: []uint64{1}}}
	if o.waits(removal) {
		t.Fatal("a removal nobody waits for is committed at once; want it held for an append")
	}
	if !o.waits([]*request{{entry: &Entry{Event: mqttmsg.Event{EventID: "a"}}}}) {
		t.Fatal("an append is held; want it committed at once")
	}

	first := appendT(t, o, "first", "t", "p")
	blocked := make(chan error, 1)
	go func() {
		_, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "second", Topic: "t", Payload: []byte("p")}})
		blocked <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !o.waits(removal) {
		if time.Now().After(deadline) {
			t.Fatal("the second append never waited for space in a full outbox")
		}
		time.Sleep(time.Millisecond)
	}
	if err := o.Remove(first.Seq); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-blocked:
		if err != nil {
			t.Fatalf("the append that waited for space: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the append that waited for space did not finish after the removal")
	}
	if got := readAll(t, o); len(got) != 1 || got[0].EventID != "second" {
		t.Fatalf("outbox holds %v, want only the second record", got)
	}
}
