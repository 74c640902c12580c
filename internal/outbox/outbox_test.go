package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		os.Exit(runChild(mode, os.Getenv(childPathEnv)))
	}
	os.Exit(m.Run())
}

func openT(t testing.TB, path string, opts Options) *Outbox {
	t.Helper()
	o, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

func appendT(t testing.TB, o *Outbox, id, topic, payload string) Record {
	t.Helper()
	r, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: id, Topic: topic, Payload: []byte(payload)}})
	if err != nil {
		t.Fatalf("Append %s: %v", id, err)
	}
	return r
}

func readAll(t testing.TB, o *Outbox) []Record {
	t.Helper()
	var all []Record
	var after uint64
	for i := 0; i < 1_000_000; i++ {
		recs, err := o.Read(after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			return all
		}
		all = append(all, recs...)
		after = recs[len(recs)-1].Seq
	}
	t.Fatal("Read did not reach the end")
	return nil
}

func TestFIFOAndSeqSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	o, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	id1, _ := o.ClientID()
	if !strings.HasPrefix(id1, "reliable-mqtt-") || len(id1) != len("reliable-mqtt-")+16 {
		t.Errorf("client ID %q, want reliable-mqtt- + 16 hex", id1)
	}
	var want []Record
	for i := 0; i < 10; i++ {
		want = append(want, appendT(t, o, fmt.Sprintf("e%d", i), "t/a", fmt.Sprintf("payload %d", i)))
	}
	got := readAll(t, o)
	if len(got) != 10 {
		t.Fatalf("read %d records, want 10", len(got))
	}
	for i, r := range got {
		if i > 0 && r.Seq <= got[i-1].Seq {
			t.Fatalf("seq not increasing: %d after %d", r.Seq, got[i-1].Seq)
		}
		w := want[i]
		if r.Seq != w.Seq || r.EventID != w.EventID || r.Topic != w.Topic || !bytes.Equal(r.Payload, w.Payload) || !r.Enqueued.Equal(w.Enqueued) {
			t.Fatalf("record %d = %+v, want %+v", i, r, w)
		}
	}
	// Read after a seq, bounded by max.
	part, err := o.Read(want[2].Seq, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(part) != 3 || part[0].Seq != want[3].Seq || part[2].Seq != want[5].Seq {
		t.Fatalf("Read(after %d, 3) = %v", want[2].Seq, seqsOf(part))
	}

	// Remove the two oldest and the newest; the newest seq must not be reused.
	if err := o.Remove(want[0].Seq, want[1].Seq, want[9].Seq, 999999); err != nil {
		t.Fatal(err)
	}
	statsBefore := o.Stats()
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}

	o = openT(t, path, Options{})
	if id2, _ := o.ClientID(); id2 != id1 {
		t.Errorf("client ID changed across reopen: %q then %q", id1, id2)
	}
	st := o.Stats()
	var wantBytes int64
	for _, r := range want[2:9] {
		wantBytes += size(r.EventID, r.Topic, encodeProps(r.Props), r.Payload)
	}
	if st.Pending != 7 || st.PendingBytes != wantBytes || !st.Oldest.Equal(want[2].Enqueued) {
		t.Errorf("Stats after reopen = %+v, want 7 pending, %d bytes, oldest %v", st, wantBytes, want[2].Enqueued)
	}
	if st != statsBefore && !(st.Pending == statsBefore.Pending && st.PendingBytes == statsBefore.PendingBytes && st.Oldest.Equal(statsBefore.Oldest)) {
		t.Errorf("Stats changed across reopen: %+v then %+v", statsBefore, st)
	}
	next := appendT(t, o, "e10", "t/a", "after reopen")
	if next.Seq <= want[9].Seq {
		t.Errorf("seq %d after reopen is not above the last ever assigned %d", next.Seq, want[9].Seq)
	}
	got = readAll(t, o)
	if len(got) != 8 || got[0].Seq != want[2].Seq || got[7].Seq != next.Seq {
		t.Errorf("after reopen read %v", seqsOf(got))
	}

	// Removing everything empties the stats.
	if err := o.Remove(seqsOf(got)...); err != nil {
		t.Fatal(err)
	}
	if st := o.Stats(); st.Pending != 0 || st.PendingBytes != 0 || !st.Oldest.IsZero() {
		t.Errorf("Stats after removing all = %+v", st)
	}
}

func seqsOf(recs []Record) []uint64 {
	s := make([]uint64, len(recs))
	for i, r := range recs {
		s[i] = r.Seq
	}
	return s
}

func TestConcurrentWritersAllCommittedRecordsSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	o, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 64, 50
	var (
		mu   sync.Mutex
		seqs = map[uint64]string{}
		wg   sync.WaitGroup
	)
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				id := fmt.Sprintf("w%d-%d", w, i)
				r, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: id, Topic: "t", Payload: []byte(id)}})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if prev, dup := seqs[r.Seq]; dup {
					errs <- fmt.Errorf("seq %d returned for %s and %s", r.Seq, prev, id)
				}
				seqs[r.Seq] = id
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o = openT(t, path, Options{})
	got := readAll(t, o)
	if len(got) != writers*each || o.Stats().Pending != writers*each {
		t.Fatalf("after reopen: %d records, Stats %+v; want %d", len(got), o.Stats(), writers*each)
	}
	for _, r := range got {
		if seqs[r.Seq] != r.EventID || string(r.Payload) != r.EventID {
			t.Fatalf("record %d = %s/%q, Append returned it for %q", r.Seq, r.EventID, r.Payload, seqs[r.Seq])
		}
	}
}

func TestDuplicateEventIDIsIdempotentAndConflictFails(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "out.db"), Options{})
	first := appendT(t, o, "evt-1", "a/b", "hello")
	again := appendT(t, o, "evt-1", "a/b", "hello")
	if again.Seq != first.Seq || !again.Enqueued.Equal(first.Enqueued) {
		t.Errorf("duplicate append returned %+v, want the pending record %+v", again, first)
	}
	if n := len(readAll(t, o)); n != 1 {
		t.Errorf("%d records after a duplicate append, want 1", n)
	}
	for _, e := range []Entry{
		{Event: mqttmsg.Event{EventID: "evt-1", Topic: "a/b", Payload: []byte("other")}},
		{Event: mqttmsg.Event{EventID: "evt-1", Topic: "a/c", Payload: []byte("hello")}},
	} {
		_, err := o.Append(context.Background(), e)
		if !errors.Is(err, ErrEventIDConflict) || !strings.Contains(err.Error(), `"evt-1"`) {
			t.Errorf("Append(%s %q) err = %v, want ErrEventIDConflict naming the event", e.Topic, e.Payload, err)
		}
	}
	if st := o.Stats(); st.Pending != 1 {
		t.Errorf("Stats = %+v after conflicts, want 1 pending", st)
	}
	// Once confirmed and removed, the ID may be used again: a new record.
	if err := o.Remove(first.Seq); err != nil {
		t.Fatal(err)
	}
	reused := appendT(t, o, "evt-1", "a/b", "different now")
	if reused.Seq <= first.Seq {
		t.Errorf("re-append after removal got seq %d, want > %d", reused.Seq, first.Seq)
	}
	if _, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{Topic: "a"}}); err == nil {
		t.Error("empty event ID accepted")
	}
}

func TestBackpressureBlocksUntilRemove(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "out.db"), Options{MaxPending: 3})
	var recs []Record
	for i := 0; i < 3; i++ {
		recs = append(recs, appendT(t, o, fmt.Sprintf("e%d", i), "t", "p"))
	}

	// A fourth append with a short deadline gives up and appends nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := o.Append(ctx, Entry{Event: mqttmsg.Event{EventID: "late", Topic: "t", Payload: []byte("p")}})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Append on a full outbox with an expiring ctx: %v", err)
	}
	if n := len(readAll(t, o)); n != 3 || o.Stats().Pending != 3 {
		t.Fatalf("%d records after a timed-out append, want 3", n)
	}

	// A fourth append without a deadline waits for a Remove.
	result := make(chan error, 1)
	go func() {
		_, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "e3", Topic: "t", Payload: []byte("p")}})
		result <- err
	}()
	select {
	case err := <-result:
		t.Fatalf("fourth Append returned while full: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := o.Remove(recs[0].Seq); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-result:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("fourth Append still blocked after Remove freed space")
	}
	if st := o.Stats(); st.Pending != 3 {
		t.Errorf("Stats = %+v, want 3 pending", st)
	}
}

func TestBackpressureByBytes(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "out.db"), Options{MaxPendingBytes: 100})
	// 2 + 1 + 40 = 43 bytes each: two fit, the third waits.
	a := appendT(t, o, "e1", "t", strings.Repeat("x", 40))
	appendT(t, o, "e2", "t", strings.Repeat("x", 40))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := o.Append(ctx, Entry{Event: mqttmsg.Event{EventID: "e3", Topic: "t", Payload: bytes.Repeat([]byte("x"), 40)}})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Append over max_pending_bytes: %v", err)
	}
	if err := o.Remove(a.Seq); err != nil {
		t.Fatal(err)
	}
	appendT(t, o, "e3", "t", strings.Repeat("x", 40))

	// An entry larger than the bound alone is admitted once the outbox is empty.
	o2 := openT(t, filepath.Join(t.TempDir(), "big.db"), Options{MaxPendingBytes: 10})
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := o2.Append(ctx, Entry{Event: mqttmsg.Event{EventID: "big", Topic: "t", Payload: make([]byte, 1000)}}); err != nil {
		t.Fatalf("oversized entry on an empty outbox: %v", err)
	}
}

func TestCloseFailsWaitingAppends(t *testing.T) {
	o, err := Open(filepath.Join(t.TempDir(), "out.db"), Options{MaxPending: 1})
	if err != nil {
		t.Fatal(err)
	}
	appendT(t, o, "e1", "t", "p")
	result := make(chan error, 1)
	go func() {
		_, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "e2", Topic: "t", Payload: []byte("p")}})
		result <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-result:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("waiting Append after Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiting Append not released by Close")
	}
	if _, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "e3", Topic: "t"}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Append after Close: %v", err)
	}
	if _, err := o.Read(0, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
	if err := o.Remove(1); !errors.Is(err, ErrClosed) {
		t.Errorf("Remove after Close: %v", err)
	}
}

func TestAppendedSignalsAfterCommit(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "out.db"), Options{})
	select {
	case <-o.Appended():
		t.Fatal("signalled before any append")
	default:
	}
	r := appendT(t, o, "e1", "t", "p")
	select {
	case <-o.Appended():
	case <-time.After(5 * time.Second):
		t.Fatal("no signal after append")
	}
	// A duplicate adds nothing and does not signal.
	appendT(t, o, "e1", "t", "p")
	if err := o.Remove(r.Seq); err != nil {
		t.Fatal(err)
	}
	select {
	case <-o.Appended():
		t.Fatal("signalled without a new record")
	default:
	}
}

const ledgerBucket = "test-ledger"

// markApplied is a participant that records key in the test ledger.
func markApplied(key string) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte(ledgerBucket))
		if err != nil {
			return err
		}
		return b.Put([]byte(key), []byte("applied"))
	}
}

func ledgerKeys(t *testing.T, o *Outbox) map[string]bool {
	t.Helper()
	keys := map[string]bool{}
	err := o.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(ledgerBucket))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error { keys[string(k)] = true; return nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestParticipantsCommitWithTheRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	o, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "e1", Topic: "t", Payload: []byte("p")}, Participants: []func(*bolt.Tx) error{markApplied("k1")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o = openT(t, path, Options{})
	if recs := readAll(t, o); len(recs) != 1 || recs[0].EventID != "e1" {
		t.Fatalf("records after reopen: %+v", recs)
	}
	if !ledgerKeys(t, o)["k1"] {
		t.Fatal("participant's key missing after reopen")
	}

	// commit.ErrAlreadyApplied: nothing appended, no error, no participant writes kept.
	skip := func(tx *bolt.Tx) error { return commit.ErrAlreadyApplied }
	r, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "e2", Topic: "t", Payload: []byte("p")}, Participants: []func(*bolt.Tx) error{markApplied("k2"), skip}})
	if err != nil || r.Seq != 0 {
		t.Fatalf("skipped append = %+v, %v; want seq 0, nil", r, err)
	}
	if n := len(readAll(t, o)); n != 1 || ledgerKeys(t, o)["k2"] {
		t.Fatalf("skip left a trace: %d records, ledger %v", n, ledgerKeys(t, o))
	}
}

func TestFailingParticipantFailsOnlyItsEntry(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "out.db"), Options{})
	boom := errors.New("ledger says no")
	fail := func(tx *bolt.Tx) error { return boom }
	const rounds, writers = 5, 16
	for round := 0; round < rounds; round++ {
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("r%d-w%d", round, w)
				ps := []func(*bolt.Tx) error{markApplied(key)}
				if w%4 == 0 {
					ps = append(ps, fail) // writes its key, then fails
				}
				_, errs[w] = o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: key, Topic: "t", Payload: []byte(key)}, Participants: ps})
			}()
		}
		wg.Wait()
		for w, err := range errs {
			if w%4 == 0 && !errors.Is(err, boom) {
				t.Errorf("writer %d with a failing participant: err = %v", w, err)
			}
			if w%4 != 0 && err != nil {
				t.Errorf("writer %d: %v", w, err)
			}
		}
	}
	keys := ledgerKeys(t, o)
	ids := map[string]bool{}
	for _, r := range readAll(t, o) {
		ids[r.EventID] = true
	}
	for round := 0; round < rounds; round++ {
		for w := 0; w < writers; w++ {
			key := fmt.Sprintf("r%d-w%d", round, w)
			ok := w%4 != 0
			if ids[key] != ok || keys[key] != ok {
				t.Errorf("%s: record present %v, ledger key present %v; want both %v", key, ids[key], keys[key], ok)
			}
		}
	}
	if st := o.Stats(); st.Pending != len(ids) {
		t.Errorf("Stats.Pending = %d, records = %d", st.Pending, len(ids))
	}
}

func TestSamePathTwiceInProcess(t *testing.T) {
	dir := t.TempDir()
	o := openT(t, filepath.Join(dir, "out.db"), Options{})
	_, err := Open(dir+"/./out.db", Options{})
	if err == nil || !strings.Contains(err.Error(), "already used by another reliable_mqtt_out in this process") {
		t.Fatalf("second Open: %v", err)
	}
	// The refused Open did not release the first outbox's file.
	appendT(t, o, "e1", "t", "p")
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o2 := openT(t, filepath.Join(dir, "out.db"), Options{})
	if n := len(readAll(t, o2)); n != 1 {
		t.Fatalf("%d records after reopen, want 1", n)
	}
}

func TestMissingDirectory(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "no", "out.db"), Options{})
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Open in a missing directory: %v", err)
	}
}

func TestPanickingParticipantFailsOnlyItsEntry(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "out.db"), Options{})
	_, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "e1", Topic: "t"}, Participants: []func(*bolt.Tx) error{func(*bolt.Tx) error { panic("ledger bug") }}})
	if err == nil || !strings.Contains(err.Error(), "ledger bug") {
		t.Fatalf("Append with a panicking participant: %v", err)
	}
	appendT(t, o, "e2", "t", "p") // the committer survived
	if n := len(readAll(t, o)); n != 1 {
		t.Fatalf("%d records, want 1", n)
	}
}

func TestSharesFileWithAnotherComponent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shared.db")
	ledger, err := boltfile.AcquireWith(path, boltfile.Options{Create: otherComponent})
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Release()
	o, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open of a file another component holds in this process: %v", err)
	}
	if o.db != ledger.DB() {
		t.Fatal("outbox and ledger got different databases for one file")
	}
	appendT(t, o, "e1", "t", "p")
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	// The outbox's Close left the ledger's handle open.
	if err := ledger.DB().View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketRecords).Stats().KeyN != 1 {
			return errors.New("record missing")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
