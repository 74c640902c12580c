package outbox

import (
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
)

// Read-only views for tools (`reliable-mqtt outbox ...`). They work inside
// a transaction the caller opened, typically on a file opened with
// boltfile.OpenReadOnly, and never write.

// ErrNoOutbox means the file holds no outbox (e.g. a ledger-only file).
var ErrNoOutbox = errors.New("no outbox in this file")

// Summary is an outbox's backlog as stored in its file.
type Summary struct {
	Pending      int
	PendingBytes int64
	FirstSeq     uint64    // oldest pending record; 0 if empty
	LastSeq      uint64    // newest pending record; 0 if empty
	Oldest       time.Time // enqueue time of FirstSeq; zero if empty
	Newest       time.Time // enqueue time of LastSeq; zero if empty
	ClientID     string
	Damaged      int    // records moved to outbox/damaged: failed their checksum, never published
	Format       uint64 // the outbox's format marker; 0: none yet (written before markers)
}

// buckets returns the outbox's buckets in tx, or ErrNoOutbox.
func buckets(tx *bolt.Tx, path string) (records, meta *bolt.Bucket, err error) {
	records, meta = tx.Bucket(bucketRecords), tx.Bucket(bucketMeta)
	if records == nil || meta == nil || tx.Bucket(bucketIDs) == nil {
		return nil, nil, fmt.Errorf("outbox file %s: %w (buckets %q, %q and %q are missing)", path, ErrNoOutbox, bucketRecords, bucketIDs, bucketMeta)
	}
	return records, meta, nil
}

// Summarize reads the stored counters and the two ends of the FIFO. O(1).
func Summarize(tx *bolt.Tx, path string) (Summary, error) {
	records, meta, err := buckets(tx, path)
	if err != nil {
		return Summary{}, err
	}
	var s Summary
	// The same source as the running output's Stats: the counters in meta.
	s.Pending = int(boltfile.Uint64(meta, keyPending))
	s.PendingBytes = int64(boltfile.Uint64(meta, keyPendingBytes))
	s.ClientID = string(meta.Get(keyClientID))
	s.Damaged = int(boltfile.Uint64(meta, keyDamaged))
	s.Format = boltfile.Uint64(meta, boltfile.KeyFormat)
	c := records.Cursor()
	if k, v := c.First(); k != nil {
		s.FirstSeq = seqFromKey(k)
		s.Oldest, _ = enqueuedOf(v)
	}
	if k, v := c.Last(); k != nil {
		s.LastSeq = seqFromKey(k)
		s.Newest, _ = enqueuedOf(v)
	}
	return s, nil
}

// Each calls fn with every pending record whose Seq > afterSeq, oldest
// first, until fn returns an error (which Each returns). A record that
// cannot be decoded is passed as a *CorruptRecordError with only Seq set in
// the Record; fn decides whether to go on.
func Each(tx *bolt.Tx, path string, afterSeq uint64, fn func(Record, error) error) error {
	records, _, err := buckets(tx, path)
	if err != nil {
		return err
	}
	if afterSeq == ^uint64(0) {
		return nil
	}
	c := records.Cursor()
	for k, v := c.Seek(seqKey(afterSeq + 1)); k != nil; k, v = c.Next() {
		seq := seqFromKey(k)
		view, err := decodeRecord(k, v, false)
		if err != nil {
			err = fn(Record{Seq: seq}, &CorruptRecordError{Path: path, Seq: seq, Err: err})
		} else {
			err = fn(view.record(seq), nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// SeqOf returns the seq of the pending record with eventID, if any.
func SeqOf(tx *bolt.Tx, path, eventID string) (uint64, bool, error) {
	if _, _, err := buckets(tx, path); err != nil {
		return 0, false, err
	}
	seq := seqFromKey(tx.Bucket(bucketIDs).Get([]byte(eventID)))
	return seq, seq != 0, nil
}

// Check verifies the outbox in tx as a start with verify_on_start would,
// and more: its buckets are all there, its keys are in order and at least
// as many as its counter says, and every record passes its checksum. It
// returns the number of records checked, or a *boltfile.DamagedError.
func Check(tx *bolt.Tx, path string) (int, error) {
	records, meta, err := buckets(tx, path)
	if err != nil {
		return 0, err
	}
	if err := format.Check(path, "the outbox", boltfile.Uint64(meta, boltfile.KeyFormat), recordVersion); err != nil {
		return 0, err
	}
	if err := checkKeys(path, records, meta); err != nil {
		return 0, err
	}
	legacy := meta.Get(boltfile.KeyChecksums) == nil
	n, bad := 0, 0
	var first string
	c := records.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		n++
		if _, err := decodeRecord(k, v, legacy); err != nil {
			if bad == 0 {
				first = fmt.Sprintf("seq %d: %v", seqFromKey(k), err)
			}
			bad++
		}
	}
	if bad > 0 {
		return n, &boltfile.DamagedError{Path: path, Cause: fmt.Sprintf("%d of %d outbox records fail their check, the first %s (a start moves them to outbox/damaged and never publishes them)", bad, n, first)}
	}
	return n, nil
}
