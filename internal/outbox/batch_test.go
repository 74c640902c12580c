package outbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// TestAppendBatchKeepsOrderAndFailsOnlyBadEntries: a batch lands in its
// order, after what was there, and an entry that cannot be stored fails
// alone (empty ID, a conflicting duplicate) while its neighbours commit.
func TestAppendBatchKeepsOrderAndFailsOnlyBadEntries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	o := openT(t, path, Options{MaxBatch: 4}) // a batch of 10 spans three transactions
	appendT(t, o, "first", "t", "p")
	var entries []Entry
	for i := 0; i < 10; i++ {
		entries = append(entries, Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("b%d", i), Topic: "t", Payload: []byte(fmt.Sprint(i))}})
	}
	entries[3].EventID = ""                                                                          // refused before the committer
	entries[6] = Entry{Event: mqttmsg.Event{EventID: "first", Topic: "t", Payload: []byte("other")}} // a conflict
	recs, errs := o.AppendBatch(context.Background(), entries)

	if errs[3] == nil || !errors.Is(errs[6], ErrEventIDConflict) {
		t.Fatalf("errs[3] = %v, errs[6] = %v; want an empty-ID error and ErrEventIDConflict", errs[3], errs[6])
	}
	want := []string{"first"}
	for i, err := range errs {
		if i == 3 || i == 6 {
			continue
		}
		if err != nil || recs[i].Seq == 0 {
			t.Fatalf("entry %d: %+v, %v", i, recs[i], err)
		}
		want = append(want, entries[i].EventID)
	}
	_ = o.Close()
	o = openT(t, path, Options{})
	got := readAll(t, o)
	if len(got) != len(want) {
		t.Fatalf("%d records after reopen, want %d", len(got), len(want))
	}
	for i, r := range got {
		if r.EventID != want[i] {
			t.Fatalf("record %d is %s, want %s (order %v)", i, r.EventID, want[i], got)
		}
	}
	if st := o.Stats(); st.Pending != len(want) {
		t.Errorf("Stats().Pending = %d, want %d", st.Pending, len(want))
	}
}

// TestAppendBatchLargerThanMaxPendingGoesThrough: a batch of 10 into an
// outbox that holds 3 is admitted in runs as records are removed, instead
// of holding reservations it can never complete.
func TestAppendBatchLargerThanMaxPendingGoesThrough(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "out.db"), Options{MaxPending: 3})
	var entries []Entry
	for i := 0; i < 10; i++ {
		entries = append(entries, Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "t", Payload: []byte("p")}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		recs []Record
		errs []error
	}
	res := make(chan result, 1)
	go func() {
		recs, errs := o.AppendBatch(ctx, entries)
		res <- result{recs, errs}
	}()

	// Drain like the sender: read what is pending, remove it, in order.
	var seen []string
	var after uint64
	for len(seen) < len(entries) && ctx.Err() == nil {
		recs, err := o.Read(after, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if st := o.Stats(); st.Pending > 3 {
			t.Fatalf("%d pending, max_pending is 3", st.Pending)
		}
		for _, r := range recs {
			seen = append(seen, r.EventID)
			if err := o.Remove(r.Seq); err != nil {
				t.Fatal(err)
			}
			after = r.Seq
		}
	}
	r := <-res
	for i, err := range r.errs {
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	for i, id := range seen {
		if id != entries[i].EventID {
			t.Fatalf("drained %v, want e0..e9 in order", seen)
		}
	}
}

// TestAppendBatchOnClosedOutbox: nothing is appended and every entry says
// why.
func TestAppendBatchOnClosedOutbox(t *testing.T) {
	o, err := Open(filepath.Join(t.TempDir(), "out.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = o.Close()
	_, errs := o.AppendBatch(context.Background(), []Entry{{Event: mqttmsg.Event{EventID: "a", Topic: "t"}}, {Event: mqttmsg.Event{EventID: "b", Topic: "t"}}})
	for i, err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("entry %d: %v, want ErrClosed", i, err)
		}
	}
}
