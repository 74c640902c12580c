package outbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// TestDrainedOutboxShrinksAtOpenAndKeepsEverything drains most of a large
// backlog in a file that also holds a ledger bucket (written by
// participants in the append transactions), reopens it, and checks the
// file shrank (boltfile's compaction at open) while every pending record,
// every ledger key, the counters and the record sequence survived.
func TestDrainedOutboxShrinksAtOpenAndKeepsEverything(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a file of 150,000 records")
	}
	path := filepath.Join(t.TempDir(), "shared.db")
	o := openT(t, path, Options{})
	for i := 0; i < 10; i++ {
		key := fmt.Sprintf("k%d", i)
		if _, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: key, Topic: "t", Payload: []byte(key)}, Participants: []func(*bolt.Tx) error{markApplied(key)}}); err != nil {
			t.Fatal(err)
		}
	}
	first, last := fillBacklog(t, o, 150_000)
	var seqs []uint64
	for s := first; s <= last-100; s++ {
		if seqs = append(seqs, s); len(seqs) == 10_000 || s == last-100 {
			if err := o.Remove(seqs...); err != nil {
				t.Fatal(err)
			}
			seqs = seqs[:0]
		}
	}
	want, err := o.Read(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 110 {
		t.Fatalf("%d records pending before reopening, want 110", len(want))
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)

	o = openT(t, path, Options{})
	if !o.file.Compacted() {
		t.Fatalf("a %d-byte file with 110 records left was not compacted at open", before.Size())
	}
	after, _ := os.Stat(path)
	if after.Size()*10 > before.Size() {
		t.Fatalf("file is %d bytes after compaction, %d before", after.Size(), before.Size())
	}
	got, err := o.Read(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("records after compaction differ:\n got %d records\nwant %d records", len(got), len(want))
	}
	if st := o.Stats(); st.Pending != 110 {
		t.Fatalf("Stats.Pending = %d after compaction, want 110", st.Pending)
	}
	if keys := ledgerKeys(t, o); len(keys) != 10 {
		t.Fatalf("ledger keys after compaction: %v, want k0..k9", keys)
	}
	r, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "after", Topic: "t", Payload: []byte("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Seq <= last {
		t.Fatalf("first append after compaction got seq %d, not after the last one before (%d): the sequence was lost", r.Seq, last)
	}
}
