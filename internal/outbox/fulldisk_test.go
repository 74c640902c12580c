package outbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// fullOutbox fills an outbox on a fresh 2 MB tmpfs with 4 kB records until
// an append fails for want of space, and reopens it. It returns the reopened
// outbox and the records it holds.
func fullOutbox(t *testing.T) (*Outbox, []Record) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
		t.Fatalf("this test mounts a tmpfs to fill a disk and needs root (tests/run runs as root): %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	path := filepath.Join(dir, "out.db")
	o := openT(t, path, Options{})
	payload := []byte(strings.Repeat("x", 4000))
	for i := 0; ; i++ {
		if i == 2000 {
			t.Fatal("2000 appends of 4 kB fitted on a 2 MB tmpfs")
		}
		_, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "t", Payload: payload}})
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o = openT(t, path, Options{})
	return o, readAll(t, o)
}

// Confirmations do not arrive in order (end-to-end ACKs, resends).
// Removing every other record rewrites every leaf and every page of the
// event-ID index: more new pages than a full disk has. Whatever part of it
// fails loses nothing, and once the rest is confirmed too (the sender keeps
// retrying what it could not remove) the outbox drains completely.
func TestFullOutboxDrainsWhateverOrderConfirmationsArriveIn(t *testing.T) {
	o, recs := fullOutbox(t)
	var even []uint64
	odd := map[uint64]bool{}
	for i, r := range recs {
		if i%2 == 0 {
			even = append(even, r.Seq)
		} else {
			odd[r.Seq] = true
		}
	}
	err := o.Remove(even...)
	if err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("scattered removal on a full disk: %v", err)
	}
	left := readAll(t, o)
	for _, r := range left {
		delete(odd, r.Seq)
	}
	if len(odd) > 0 {
		t.Fatalf("%d unconfirmed records vanished in a scattered removal (err %v)", len(odd), err)
	}
	t.Logf("scattered removal of %d of %d records: %d left, err %v", len(even), len(recs), len(left), err)
	if err := o.Remove(seqsOf(recs)...); err != nil {
		t.Fatalf("removing every record of a full outbox: %v", err)
	}
	if got := readAll(t, o); len(got) != 0 || o.Stats().Pending != 0 {
		t.Fatalf("after removing everything: %d records, Stats %+v", len(got), o.Stats())
	}
	if _, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "after", Topic: "t", Payload: []byte("p")}}); err != nil {
		t.Fatalf("append after draining: %v", err)
	}
}

// A removal and an append that cannot be written arrive in one group: the
// removal commits anyway, the append fails or is written into the space the
// removal freed, and the file says which.
func TestRemovalCommitsWhenAnAppendInItsGroupDoesNotFit(t *testing.T) {
	o, recs := fullOutbox(t)
	big := strings.Repeat("y", 64<<10) // more than two removed records free
	app := &request{ctx: context.Background(), entry: &Entry{Event: mqttmsg.Event{EventID: "big", Topic: "t", Payload: []byte(big)}},
		size: size("big", "t", nil, []byte(big)), done: make(chan struct{}, 1)}
	rem := &request{ctx: context.Background(), seqs: []uint64{recs[0].Seq, recs[1].Seq}, done: make(chan struct{}, 1)}
	o.mu.Lock()
	o.reservedN++
	o.reservedBytes += app.size
	o.mu.Unlock()
	// One submission, so the committer takes both into one transaction.
	o.reqs <- []*request{app, rem}
	<-app.done
	<-rem.done
	if rem.err != nil {
		t.Fatalf("the removal failed with the append beside it: %v", rem.err)
	}
	if !errors.Is(app.err, syscall.ENOSPC) {
		t.Fatalf("the 64 kB append on a full disk: err = %v, want no space left on device", app.err)
	}
	got := readAll(t, o)
	if len(got) != len(recs)-2 || got[0].Seq != recs[2].Seq {
		t.Fatalf("after the group: %d records from seq %d; want %d from seq %d", len(got), got[0].Seq, len(recs)-2, recs[2].Seq)
	}
	if st := o.Stats(); st.Pending != len(recs)-2 {
		t.Fatalf("Stats.Pending = %d, want %d", st.Pending, len(recs)-2)
	}
}
