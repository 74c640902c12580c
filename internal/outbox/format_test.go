package outbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// rawUpdate writes to a closed outbox file behind its back.
func rawUpdate(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

func closeT(t *testing.T, o *Outbox) {
	t.Helper()
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
}

// withVersion re-stamps a stored record as another version with a valid
// checksum: what a newer release would have written.
func withVersion(key, v []byte, version byte) []byte {
	body := append([]byte(nil), v[:len(v)-crcLen]...)
	body[0] = version
	return binary.BigEndian.AppendUint32(body, boltfile.Checksum(key, body))
}

func wantNewer(t *testing.T, err error, path, what string, found int) {
	t.Helper()
	if !format.IsNewer(err) {
		t.Fatalf("got %v, want a newer-format refusal", err)
	}
	for _, s := range []string{path, what, fmt.Sprintf("format version %d", found), "reads versions 1 to 3", "run the release that wrote it, or a newer one"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the refusal does not say %q: %v", s, err)
		}
	}
}

func TestOutboxNamesItsFormatAndAnUnmarkedOneGetsIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	o := openT(t, path, Options{})
	appendT(t, o, "a", "t", "x")
	closeT(t, o)
	stored := func() (v []byte) {
		db, err := boltfile.OpenReadOnly(path, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		_ = db.View(func(tx *bolt.Tx) error {
			v = append([]byte(nil), tx.Bucket(bucketMeta).Get(boltfile.KeyFormat)...)
			return nil
		})
		return v
	}
	if v := stored(); len(v) != 8 || binary.BigEndian.Uint64(v) != recordVersion {
		t.Fatalf("a new outbox stores format %x, want %d", v, recordVersion)
	}
	// A file written before the marker existed: read as today's format.
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(boltfile.KeyFormat) })
	o = openT(t, path, Options{})
	if got := readAll(t, o); len(got) != 1 || got[0].EventID != "a" {
		t.Fatalf("read %+v", got)
	}
	closeT(t, o)
	if v := stored(); len(v) != 8 || binary.BigEndian.Uint64(v) != recordVersion {
		t.Fatalf("an unmarked outbox got format %x at open, want %d", v, recordVersion)
	}
}

func TestNewerOutboxFormatIsRefusedUntouched(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	o := openT(t, path, Options{})
	appendT(t, o, "a", "t", "x")
	closeT(t, o)
	rawUpdate(t, path, func(tx *bolt.Tx) error { return boltfile.PutUint64(tx.Bucket(bucketMeta), boltfile.KeyFormat, 4) })
	before, _ := os.ReadFile(path)
	_, err := Open(path, Options{})
	wantNewer(t, err, path, "the outbox", 4)
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("the refused file was written")
	}
}

// A record of a newer version is refused wherever it is met, never set
// aside: at open (the queue's ends, every record when verified), and by
// Read in the middle of an unverified queue.
func TestNewerRecordVersionIsRefusedNotSetAside(t *testing.T) {
	for _, c := range []struct {
		name   string
		seq    uint64
		verify boltfile.Verify
		atOpen bool
	}{
		{"last record", 3, boltfile.VerifyNever, true},
		{"middle record, verified start", 2, boltfile.VerifyAlways, true},
		{"middle record, unverified start", 2, boltfile.VerifyNever, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out.db")
			o := openT(t, path, Options{})
			for i := range 3 {
				appendT(t, o, fmt.Sprintf("e%d", i), "t", "x")
			}
			closeT(t, o)
			rawUpdate(t, path, func(tx *bolt.Tx) error {
				b := tx.Bucket(bucketRecords)
				k := seqKey(c.seq)
				return b.Put(k, withVersion(k, b.Get(k), 4))
			})
			what := fmt.Sprintf("outbox record seq %d", c.seq)
			o, err := Open(path, Options{Verify: c.verify})
			if c.atOpen {
				wantNewer(t, err, path, what, 4)
			} else {
				if err != nil {
					t.Fatal(err)
				}
				// The record before it is read; the read that reaches it fails.
				recs, err := o.Read(0, 10)
				if err != nil || len(recs) != 1 || recs[0].Seq != 1 {
					t.Fatalf("Read(0) = %v, %v; want seq 1 alone", recs, err)
				}
				_, err = o.Read(1, 10)
				wantNewer(t, err, path, what, 4)
				if st := o.Stats(); st.Damaged != 0 || st.Pending != 3 {
					t.Fatalf("stats %+v after the refusal", st)
				}
				closeT(t, o)
			}
			rawUpdate(t, path, func(tx *bolt.Tx) error {
				if v := tx.Bucket(bucketRecords).Get(seqKey(c.seq)); v == nil || v[0] != 4 {
					return errors.New("the newer record left the queue")
				}
				if b := tx.Bucket(bucketDamaged); b != nil && b.Stats().KeyN != 0 {
					return errors.New("something was set aside")
				}
				return nil
			})
		})
	}
}

// setAsideAsAnOldReleaseDid moves records to outbox/damaged the way a
// release that did not know their version did.
func setAsideAsAnOldReleaseDid(t *testing.T, path string, seqs ...uint64) {
	t.Helper()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		records, meta := tx.Bucket(bucketRecords), tx.Bucket(bucketMeta)
		aside, err := tx.CreateBucketIfNotExists(bucketDamaged)
		if err != nil {
			return err
		}
		for _, seq := range seqs {
			k := seqKey(seq)
			v := append([]byte(nil), records.Get(k)...)
			if err := aside.Put(k, v); err != nil {
				return err
			}
			if err := records.Delete(k); err != nil {
				return err
			}
			if err := boltfile.PutUint64(meta, keyDamaged, boltfile.Uint64(meta, keyDamaged)+1); err != nil {
				return err
			}
			if err := addPending(meta, -1, -estimatedSize(v)); err != nil {
				return err
			}
		}
		return nil
	})
}

func TestRestorePutsReadableRecordsBackInTheirPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	o := openT(t, path, Options{})
	var want []Record
	for i := range 5 {
		e := Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "t", Payload: []byte(fmt.Sprintf("p%d", i))}}
		if i%2 == 0 { // version 3: with MQTT 5 properties
			e.Props = &mqttmsg.Properties{User: []mqttmsg.UserProperty{{Key: "k", Value: fmt.Sprint(i)}}}
		}
		r, err := o.Append(t.Context(), e)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, r)
	}
	wantBytes := o.Stats().PendingBytes
	closeT(t, o)
	setAsideAsAnOldReleaseDid(t, path, 1, 2, 3, 4)
	rawUpdate(t, path, func(tx *bolt.Tx) error { // seq 4's bytes are damaged
		b := tx.Bucket(bucketDamaged)
		v := append([]byte(nil), b.Get(seqKey(4))...)
		v[len(v)-6] ^= 1
		return b.Put(seqKey(4), v)
	})
	// A new copy of e2 (seq 3) was appended since: it stays the pending one.
	o = openT(t, path, Options{})
	if _, err := o.Append(t.Context(), Entry{Event: mqttmsg.Event{EventID: "e2", Topic: "t", Payload: []byte("p2")}}); err != nil {
		t.Fatal(err)
	}
	closeT(t, o)

	db, err := boltfile.OpenReadOnly(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	if err := db.View(func(tx *bolt.Tx) error {
		return EachAside(tx, path, func(a AsideRecord) error {
			kinds = append(kinds, fmt.Sprintf("%d:%s", a.Seq, a.Kind))
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if got := strings.Join(kinds, " "); got != "1:readable 2:readable 3:readable 4:checksum" {
		t.Fatalf("set aside: %s", got)
	}

	r, err := Restore(path)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(r.Seqs) != "[1 2]" || len(r.Kept) != 2 || r.Kept[0].Seq != 3 || !strings.Contains(r.Kept[0].Reason, "pending again as seq 6") || r.Kept[1].Kind != AsideChecksum {
		t.Fatalf("restored %v, kept %+v", r.Seqs, r.Kept)
	}
	o = openT(t, path, Options{})
	got := readAll(t, o)
	if fmt.Sprint(seqsOf(got)) != "[1 2 5 6]" {
		t.Fatalf("queue after restore: %v", seqsOf(got))
	}
	for i, seq := range []int{1, 2, 5} {
		g, w := got[i], want[seq-1]
		if g.EventID != w.EventID || !bytes.Equal(g.Payload, w.Payload) || !bytes.Equal(encodeProps(g.Props), encodeProps(w.Props)) || !g.Enqueued.Equal(w.Enqueued) {
			t.Errorf("seq %d restored as %+v, written as %+v", seq, g, w)
		}
	}
	st := o.Stats()
	if st.Pending != 4 || st.Damaged != 2 {
		t.Fatalf("stats after restore %+v", st)
	}
	// The pending bytes count the restored records again: removing all
	// brings them to 0.
	if err := o.Remove(seqsOf(got)...); err != nil {
		t.Fatal(err)
	}
	if st := o.Stats(); st.Pending != 0 || st.PendingBytes != 0 {
		t.Fatalf("after removing everything: %+v (pending bytes when written: %d)", st, wantBytes)
	}
}

func TestRestoreRefusesAFileAnotherProcessHolds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	o := openT(t, path, Options{})
	appendT(t, o, "a", "t", "x")
	closeT(t, o)
	setAsideAsAnOldReleaseDid(t, path, 1)
	// bbolt's lock is flock: a second descriptor is refused like a
	// second process.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Restore(path)
	db.Close()
	if !errors.Is(err, boltfile.ErrLocked) || !strings.Contains(err.Error(), "nothing restored") {
		t.Fatalf("Restore of a held file: %v", err)
	}
}
