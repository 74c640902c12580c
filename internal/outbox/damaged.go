package outbox

import (
	"bytes"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
)

// Damaged records. Every read checks a record's checksum; one that fails is
// never returned to a sender. It is moved, byte for byte, to outbox/damaged
// (same key) by the committer, counted in outbox/meta "damaged", and
// reported through Options.OnDamaged; the records after it go on.
var (
	bucketDamaged = []byte("outbox/damaged")
	keyDamaged    = []byte("damaged")
)

// upgradeBatch bounds the records rewritten per upgrade transaction.
const upgradeBatch = 10000

// DamagedRecord is a record that failed its checksum (or its decoding) and
// was moved to the outbox/damaged bucket. It was never published.
type DamagedRecord struct {
	Path   string
	Seq    uint64 // 0 if the key itself is not a sequence number
	Size   int    // bytes of the stored value
	Reason string
}

func (d DamagedRecord) String() string {
	return fmt.Sprintf("outbox file %s: record seq %d (%d bytes) is damaged (%s); it was not published and was moved to the %q bucket; the records after it go on",
		d.Path, d.Seq, d.Size, d.Reason, bucketDamaged)
}

// suspect is a record a reader found damaged, to be moved aside.
type suspect struct {
	key    []byte
	reason string
}

// moveAside moves the value under key from records to outbox/damaged if it
// still fails to decode, and returns what it did (ok=false: nothing).
// Caller updates the pending counters with the returned size estimate.
func (o *Outbox) moveAside(tx *bolt.Tx, key []byte, reason string) (d DamagedRecord, size int64, ok bool, err error) {
	records := tx.Bucket(bucketRecords)
	v := records.Get(key)
	if v == nil {
		if b := tx.Bucket(bucketDamaged); b != nil && b.Get(key) != nil {
			return d, 0, false, nil // another reader moved it first
		}
		// A reader saw this key, and nothing else removes a damaged record:
		// a lookup that misses it means the page's order is damaged.
		return d, 0, false, &boltfile.DamagedError{Path: o.path, Cause: fmt.Sprintf("outbox record key %x, seen by a reader, cannot be looked up: a page of records is damaged", key)}
	}
	if err := newerRecord(o.path, key, v); err != nil {
		return d, 0, false, err // not damage: never set aside
	}
	if _, derr := decodeRecord(key, v, false); derr == nil {
		return d, 0, false, nil // reads fine now: keep it
	} else if reason == "" {
		reason = derr.Error()
	}
	damaged, err := tx.CreateBucketIfNotExists(bucketDamaged)
	if err != nil {
		return d, 0, false, err
	}
	if err := damaged.Put(key, append([]byte(nil), v...)); err != nil {
		return d, 0, false, err
	}
	if err := records.Delete(key); err != nil {
		return d, 0, false, err
	}
	meta := tx.Bucket(bucketMeta)
	if err := boltfile.PutUint64(meta, keyDamaged, boltfile.Uint64(meta, keyDamaged)+1); err != nil {
		return d, 0, false, err
	}
	d = DamagedRecord{Path: o.path, Seq: seqFromKey(key), Size: len(v), Reason: reason}
	return d, estimatedSize(v), true, nil
}

// estimatedSize is what a damaged value is taken to have counted against
// pending_bytes: its length less the fixed overhead (its own length fields
// cannot be trusted).
func estimatedSize(v []byte) int64 {
	n := int64(len(v) - headerLen - crcLen - 2)
	return max(n, 0)
}

// upgradeRecords rewrites version-1 records (written before checksums)
// with a checksum, upgradeBatch per transaction, then marks the file as
// checksummed. A version-1 record that does not decode is moved aside.
func (o *Outbox) upgradeRecords() error {
	var found []DamagedRecord
	err := o.file.UpdateInBatches(bucketRecords, upgradeBatch, func(tx *bolt.Tx, k, v []byte) error {
		if len(v) > 0 && (v[0] == recordVersion || v[0] == recordVersionV2) {
			return nil
		}
		if err := newerRecord(o.path, k, v); err != nil {
			return err
		}
		view, err := decodeRecord(k, v, true)
		if err != nil {
			d, sz, ok, err := o.moveAside(tx, k, "unreadable record written before checksums: "+err.Error())
			if err != nil || !ok {
				return err
			}
			found = append(found, d)
			return addPending(tx.Bucket(bucketMeta), -1, -sz)
		}
		rec := view.record(seqFromKey(k))
		return tx.Bucket(bucketRecords).Put(k, encodeRecord(&rec))
	}, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(boltfile.KeyChecksums, []byte{1})
	})
	if format.IsNewer(err) {
		return err
	}
	if err != nil {
		return fmt.Errorf("outbox file %s: adding checksums to the records written by an earlier version failed (nothing is lost; the file is read as before and upgraded at the next start): %w", o.path, err)
	}
	for _, d := range found {
		o.reportDamaged(d)
	}
	return nil
}

// checkCount compares the records in the file with the stored counter: a
// damaged page can drop records without any read failing (a leaf's element
// count lowered). It walks every record: run at open only after the file's
// structure was verified (Read runs the same check when it reaches the end
// of the queue).
func (o *Outbox) checkCount() error {
	return o.file.View(func(tx *bolt.Tx) error {
		return checkKeys(o.path, tx.Bucket(bucketRecords), tx.Bucket(bucketMeta))
	})
}

// checkKeys walks the whole queue, in one pass checking that its keys are
// in order, that none holds a record of a newer version (refused whole, not
// set aside), and that there are at least as many as the counter says. Order
// is checked over the whole queue, not just what a reader walked: a damaged
// key that sorts below its neighbours can be jumped over by a seek's binary
// search, and would stay pending, never read and never reported.
func checkKeys(path string, records, meta *bolt.Bucket) error {
	want := boltfile.Uint64(meta, keyPending)
	var have uint64
	var prev []byte
	c := records.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if prev != nil && bytes.Compare(k, prev) <= 0 {
			return outOfOrder(path, k, prev)
		}
		if err := newerRecord(path, k, v); err != nil {
			return err
		}
		prev = k
		have++
	}
	if have < want {
		return &boltfile.DamagedError{Path: path, Cause: fmt.Sprintf("its counter says %d outbox records are pending but only %d are in the file: %d records were lost to damage", want, have, want-have)}
	}
	return nil
}

// outOfOrder reports keys out of order: a damaged page, on which seeks miss
// records and a record cannot be found again to move it aside.
func outOfOrder(path string, k, prev []byte) error {
	return &boltfile.DamagedError{Path: path, Cause: fmt.Sprintf("outbox keys out of order (%x after %x): a page of records is damaged", k, prev)}
}

func (o *Outbox) reportDamaged(d DamagedRecord) {
	if o.opts.OnDamaged != nil {
		o.opts.OnDamaged(d)
	}
}

func addPending(meta *bolt.Bucket, n int64, nbytes int64) error {
	p := int64(boltfile.Uint64(meta, keyPending)) + n
	b := int64(boltfile.Uint64(meta, keyPendingBytes)) + nbytes
	if err := boltfile.PutUint64(meta, keyPending, uint64(max(p, 0))); err != nil {
		return err
	}
	return boltfile.PutUint64(meta, keyPendingBytes, uint64(max(b, 0)))
}
