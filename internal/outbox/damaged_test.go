package outbox

import (
	"encoding/binary"
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
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// damageValue flips one byte of a stored record in place, behind the
// outbox's back, the way a bad disk block would.
func damageValue(t *testing.T, o *Outbox, seq uint64, at int) {
	t.Helper()
	if err := o.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		v := append([]byte(nil), b.Get(seqKey(seq))...)
		v[at%len(v)] ^= 0x01
		return b.Put(seqKey(seq), v)
	}); err != nil {
		t.Fatal(err)
	}
}

func TestDamagedRecordIsMovedAsideAndTheRestGoOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	var mu sync.Mutex
	var reports []DamagedRecord
	o := openT(t, path, Options{OnDamaged: func(d DamagedRecord) {
		mu.Lock()
		reports = append(reports, d)
		mu.Unlock()
	}})
	var recs []Record
	for i := range 6 {
		recs = append(recs, appendT(t, o, fmt.Sprintf("e%d", i), "t", fmt.Sprintf("payload-%d", i)))
	}
	// A flip in the payload: still decodes, only the checksum tells.
	damageValue(t, o, recs[1].Seq, 20)
	damageValue(t, o, recs[4].Seq, 0) // the version byte
	before := o.Stats()

	got := readAll(t, o)
	var ids []string
	for _, r := range got {
		ids = append(ids, r.EventID)
	}
	if strings.Join(ids, ",") != "e0,e2,e3,e5" {
		t.Fatalf("read %v, want e0,e2,e3,e5", ids)
	}
	st := o.Stats()
	if st.Damaged != 2 || st.Pending != before.Pending-2 {
		t.Fatalf("stats %+v (before %+v), want 2 damaged and 2 fewer pending", st, before)
	}
	mu.Lock()
	if len(reports) != 2 || reports[0].Seq != recs[1].Seq || !strings.Contains(reports[0].String(), path) ||
		!strings.Contains(reports[0].Reason, "checksum mismatch") {
		t.Fatalf("reports = %+v", reports)
	}
	mu.Unlock()
	// The damaged bytes are kept, in their own bucket, under their key.
	if err := o.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketDamaged).Stats().KeyN != 2 || tx.Bucket(bucketRecords).Get(seqKey(recs[1].Seq)) != nil {
			return fmt.Errorf("damaged records not moved")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The count survives a restart.
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o2 := openT(t, path, Options{})
	if st := o2.Stats(); st.Damaged != 2 || st.Pending != 4 {
		t.Fatalf("after reopen: %+v", st)
	}
	// The event ID of a damaged record can be appended again: the writer's
	// retry restores the message.
	r := appendT(t, o2, "e1", "t", "payload-1")
	if r.Seq <= recs[5].Seq {
		t.Fatalf("re-appended e1 got seq %d, want a new one", r.Seq)
	}
}

func TestAppendOverADamagedPendingCopyReplacesIt(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "out.db"), Options{})
	first := appendT(t, o, "e1", "t", "p")
	damageValue(t, o, first.Seq, 12)
	again := appendT(t, o, "e1", "t", "p")
	if again.Seq == first.Seq {
		t.Fatal("the damaged copy was returned as the pending record")
	}
	if got := readAll(t, o); len(got) != 1 || got[0].Seq != again.Seq || string(got[0].Payload) != "p" {
		t.Fatalf("read %+v", got)
	}
	if st := o.Stats(); st.Damaged != 1 || st.Pending != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestAValueUnderTheWrongKeyFails(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "out.db"), Options{})
	a := appendT(t, o, "a", "t", "pa")
	b := appendT(t, o, "b", "t", "pb")
	// b's intact value copied under a's key: only the key in the checksum
	// catches it.
	if err := o.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRecords)
		return bk.Put(seqKey(a.Seq), append([]byte(nil), bk.Get(seqKey(b.Seq))...))
	}); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, o); len(got) != 1 || got[0].EventID != "b" {
		t.Fatalf("read %+v, want only b", got)
	}
}

// encodeRecordV1 is the record format written before checksums (main up to
// this change), kept here to make files the way that code made them.
func encodeRecordV1(r *Record) []byte {
	b := make([]byte, headerLen)
	b[0] = recordVersionV1
	binary.BigEndian.PutUint64(b[1:], uint64(r.Enqueued.UnixNano()))
	b = binary.AppendUvarint(b, uint64(len(r.EventID)))
	b = append(b, r.EventID...)
	b = binary.AppendUvarint(b, uint64(len(r.Topic)))
	b = append(b, r.Topic...)
	return append(b, r.Payload...)
}

// writeV1Outbox writes an outbox as the code before checksums did: records
// without checksums and no "checksums" mark.
func writeV1Outbox(t *testing.T, path string, n int) {
	t.Helper()
	f, err := boltfile.AcquireWith(path, boltfile.Options{Create: otherComponent})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	if err := f.Update(func(tx *bolt.Tx) error {
		records, _ := tx.CreateBucket(bucketRecords)
		ids, _ := tx.CreateBucket(bucketIDs)
		meta, _ := tx.CreateBucket(bucketMeta)
		var bytesTotal int64
		for i := range n {
			seq, _ := records.NextSequence()
			r := Record{Event: mqttmsg.Event{EventID: fmt.Sprintf("old-%d", i), Topic: "t/old", Payload: []byte(fmt.Sprintf("legacy %d", i))}, Seq: seq, Enqueued: time.Unix(0, int64(1e18+i))}
			if err := records.Put(seqKey(seq), encodeRecordV1(&r)); err != nil {
				return err
			}
			if err := ids.Put([]byte(r.EventID), seqKey(seq)); err != nil {
				return err
			}
			bytesTotal += size(r.EventID, r.Topic, encodeProps(r.Props), r.Payload)
		}
		_ = boltfile.PutUint64(meta, keyPending, uint64(n))
		_ = boltfile.PutUint64(meta, keyPendingBytes, uint64(bytesTotal))
		return meta.Put(keyClientID, []byte("reliable-mqtt-0123456789abcdef"))
	}); err != nil {
		t.Fatal(err)
	}
}

func TestOutboxWrittenBeforeChecksumsIsUpgraded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	n := upgradeBatch + 7 // more than one upgrade transaction
	writeV1Outbox(t, path, n)

	o := openT(t, path, Options{})
	if id, _ := o.ClientID(); id != "reliable-mqtt-0123456789abcdef" {
		t.Fatalf("client ID %q", id)
	}
	got := readAll(t, o)
	if len(got) != n {
		t.Fatalf("read %d of %d old records", len(got), n)
	}
	for i, r := range got {
		if r.EventID != fmt.Sprintf("old-%d", i) || string(r.Payload) != fmt.Sprintf("legacy %d", i) || r.Topic != "t/old" {
			t.Fatalf("record %d = %+v", i, r)
		}
	}
	// Every value now carries a checksum, and the file says so.
	if err := o.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketMeta).Get(boltfile.KeyChecksums) == nil {
			return fmt.Errorf("no checksums mark")
		}
		return tx.Bucket(bucketRecords).ForEach(func(k, v []byte) error {
			if _, err := decodeRecord(k, v, false); err != nil {
				return fmt.Errorf("seq %d: %w", seqFromKey(k), err)
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	// After the upgrade a value without a checksum is damage, not legacy.
	if err := o.db.Update(func(tx *bolt.Tx) error {
		r := got[3]
		return tx.Bucket(bucketRecords).Put(seqKey(r.Seq), encodeRecordV1(&r))
	}); err != nil {
		t.Fatal(err)
	}
	if again := readAll(t, o); len(again) != n-1 || o.Stats().Damaged != 1 {
		t.Fatalf("after writing a version-1 value: %d records, %d damaged", len(again), o.Stats().Damaged)
	}
}

func TestVerifiedOpenRefusesAnOutboxThatLostRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	o := openT(t, path, Options{})
	for i := range 5 {
		appendT(t, o, fmt.Sprintf("e%d", i), "t", "p")
	}
	// Records vanish without any value failing: what a lowered leaf
	// element count does.
	if err := o.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecords).Delete(seqKey(3))
	}); err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path, Options{Verify: boltfile.VerifyAlways})
	if err == nil || !strings.Contains(err.Error(), "5 outbox records are pending but only 4") || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v", err)
	}
	// Unverified, the open succeeds, and the loss shows when a read
	// reaches the end of the queue.
	o2 := openT(t, path, Options{Verify: boltfile.VerifyNever})
	if got, err := o2.Read(0, 2); err != nil || len(got) != 2 {
		t.Fatalf("a read that stops before the end: %d records, %v", len(got), err)
	}
	if _, err := o2.Read(0, 10); !errors.Is(err, boltfile.ErrDamaged) || !strings.Contains(err.Error(), "lost to damage") {
		t.Fatalf("a read to the end: %v", err)
	}
}

func TestUnreadableRecordOfAnOldOutboxIsMovedAsideByTheUpgrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	writeV1Outbox(t, path, 3)
	f, err := boltfile.AcquireWith(path, boltfile.Options{Create: otherComponent})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecords).Put(seqKey(2), []byte{recordVersionV1, 1, 2})
	}); err != nil {
		t.Fatal(err)
	}
	_ = f.Release()
	o := openT(t, path, Options{})
	got := readAll(t, o)
	if len(got) != 2 || got[0].EventID != "old-0" || got[1].EventID != "old-2" {
		t.Fatalf("read %+v", got)
	}
	if st := o.Stats(); st.Damaged != 1 || st.Pending != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestAKeyDamagedToSortBeforeTheReaderIsRefused: a damaged key that sorts
// below its neighbours can be jumped over by the binary search of a later
// Read's seek. The counter still matches the number of keys, so without a
// check of the whole queue's order the reader would find nothing more,
// report no error, and the record would stay pending for ever. (Today the
// open refuses it first.)
func TestAKeyDamagedToSortBeforeTheReaderIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.db")
	o := openT(t, path, Options{})
	const n = 15
	for i := range n {
		appendT(t, o, fmt.Sprintf("e%d", i), "t", strings.Repeat("p", 100))
	}
	var root, pageSize int64
	if err := o.db.View(func(tx *bolt.Tx) error {
		root, pageSize = int64(tx.Bucket(bucketRecords).Root()), int64(o.db.Info().PageSize)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The records fit one leaf page (header: id 8, flags 2, count 2,
	// overflow 4; then elements: flags, pos, ksize, vsize, 4 bytes each,
	// pos counted from the element).
	pg := b[root*pageSize : (root+1)*pageSize]
	if flags, count := binary.LittleEndian.Uint16(pg[8:]), binary.LittleEndian.Uint16(pg[10:]); root == 0 || flags != 0x02 || count != n {
		t.Fatalf("the records are not on one leaf page (root %d, flags %#x, %d elements)", root, flags, count)
	}
	const at = 9 // holds seq 10
	elem := 16 + at*16
	pos := elem + int(binary.LittleEndian.Uint32(pg[elem+4:]))
	copy(pg[pos:pos+8], seqKey(0))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}

	// bbolt rebuilds its freelist at open by checking the whole tree, keys
	// in order included (boltfile: no freelist is synced), so the file is
	// refused before anything is read; if it is not, the reader must be.
	o2, err := Open(path, Options{Verify: boltfile.VerifyNever})
	if err != nil {
		if !errors.Is(err, boltfile.ErrDamaged) || !strings.Contains(err.Error(), path) {
			t.Fatalf("the open failed without naming the damage: %v", err)
		}
		return
	}
	t.Cleanup(func() { _ = o2.Close() })
	// Drain as the sender does: read on from the last seq read, remove
	// what was read (as if confirmed).
	var after uint64
	for i := 0; i < 2*n; i++ {
		max := 9
		if i > 0 {
			max = 100
		}
		recs, err := o2.Read(after, max)
		if err != nil {
			if !errors.Is(err, boltfile.ErrDamaged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "out of order") {
				t.Fatalf("the read failed without naming the damage: %v", err)
			}
			return
		}
		if len(recs) == 0 {
			t.Fatalf("the reader found nothing more, with no error, with %d records pending", o2.Stats().Pending)
		}
		for _, r := range recs {
			if err := o2.Remove(r.Seq); err != nil {
				t.Fatal(err)
			}
			after = r.Seq
		}
	}
	t.Fatal("the drain did not end")
}

// otherComponent creates a file the way another component sharing it (a
// dedup ledger) would, with a bucket of its own.
func otherComponent(tx *bolt.Tx) error {
	_, err := tx.CreateBucket([]byte("other"))
	return err
}

// TestOutboxWhoseDataIsGoneIsRefused: what a cut on a disk that ignores
// flushes can leave where a full outbox was — the records gone under a
// counter that says otherwise, or part of the buckets — is refused at open
// with the damaged-file message naming the file, never started afresh.
func TestOutboxWhoseDataIsGoneIsRefused(t *testing.T) {
	cases := map[string]func(tx *bolt.Tx) error{
		"records gone, counter kept": func(tx *bolt.Tx) error {
			if err := tx.DeleteBucket(bucketRecords); err != nil {
				return err
			}
			_, err := tx.CreateBucket(bucketRecords)
			return err
		},
		"records bucket gone": func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketRecords) },
		"meta bucket gone":    func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketMeta) },
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out.db")
			o, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			appendT(t, o, "e1", "t", "p")
			appendT(t, o, "e2", "t", "p")
			if err := o.Close(); err != nil {
				t.Fatal(err)
			}
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(damage); err != nil {
				t.Fatal(err)
			}
			_ = db.Close()
			_, err = Open(path, Options{Verify: boltfile.VerifyNever})
			if !errors.Is(err, boltfile.ErrDamaged) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Open: %v, want a damaged-file refusal naming %s", err, path)
			}
		})
	}
}

// TestOutboxAddedToALedgerFile: a file another component created holds no
// outbox yet; Open adds one (the shared-file case, not damage).
func TestOutboxAddedToALedgerFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shared.db")
	f, err := boltfile.AcquireWith(path, boltfile.Options{Create: otherComponent})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Release(); err != nil {
		t.Fatal(err)
	}
	o := openT(t, path, Options{})
	appendT(t, o, "e1", "t", "p")
	if n := len(readAll(t, o)); n != 1 {
		t.Fatalf("%d records, want 1", n)
	}
}
