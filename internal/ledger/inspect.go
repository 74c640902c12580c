package ledger

import (
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
)

// Read-only views for tools (`reliable-mqtt ledger ...`). They work inside
// a transaction the caller opened, typically on a file opened with
// boltfile.OpenReadOnly, and never write.

// ErrNoLedger means the file holds no dedup ledger (e.g. an outbox-only file).
var ErrNoLedger = errors.New("no dedup ledger in this file")

// Summary is a ledger as stored in its file.
type Summary struct {
	Keys   int64
	Oldest time.Time // earliest applied time still kept; zero if empty
	Newest time.Time // latest applied time; zero if empty
	Clock  time.Time // the ledger clock's stored reading (clock.go); zero if none
}

// Entry is what the ledger holds for one key.
type Entry struct {
	Applied bool
	At      time.Time
	Hash    [32]byte // SHA-256 of the payload
}

func ledgerBuckets(tx *bolt.Tx, path string) (keys, times, meta *bolt.Bucket, err error) {
	keys, times, meta = tx.Bucket(bucketKeys), tx.Bucket(bucketTime), tx.Bucket(bucketMeta)
	if keys == nil || times == nil || meta == nil {
		return nil, nil, nil, fmt.Errorf("dedup ledger file %s: %w (buckets %q, %q and %q are missing)", path, ErrNoLedger, bucketKeys, bucketTime, bucketMeta)
	}
	return keys, times, meta, nil
}

// Summarize reads the stored key count and the two ends of the retention
// index. O(1).
func Summarize(tx *bolt.Tx, path string) (Summary, error) {
	_, times, meta, err := ledgerBuckets(tx, path)
	if err != nil {
		return Summary{}, err
	}
	s := Summary{Keys: int64(boltfile.Uint64(meta, keyCount)), Clock: StoredClock(tx)}
	c := times.Cursor()
	first, _ := c.First()
	last, _ := c.Last()
	if at, _, ok := splitTimeKey(first); ok {
		s.Oldest = time.Unix(0, at)
	}
	if at, _, ok := splitTimeKey(last); ok {
		s.Newest = time.Unix(0, at)
	}
	return s, nil
}

// StoredClock is the ledger clock's reading stored in tx: what its keys'
// times are measured against. Zero if the file has none (yet).
func StoredClock(tx *bolt.Tx) time.Time {
	meta := tx.Bucket(bucketMeta)
	if meta == nil || meta.Get(keyClock) == nil {
		return time.Time{}
	}
	return time.Unix(0, int64(boltfile.Uint64(meta, keyClock)))
}

// LookupIn reads key's entry inside tx.
func LookupIn(tx *bolt.Tx, path string, key claims.Key) (Entry, error) {
	return lookupIn(tx, path, key, func(err error) error {
		return fmt.Errorf("dedup ledger file %s: key %s: %w", path, key, err)
	})
}

// lookupIn is LookupIn with the error for an entry that fails its
// checksum made by damaged.
func lookupIn(tx *bolt.Tx, path string, key claims.Key, damaged func(error) error) (Entry, error) {
	keys, _, _, err := ledgerBuckets(tx, path)
	if err != nil {
		return Entry{}, err
	}
	k, err := encodeKey(key)
	if err != nil {
		return Entry{}, err
	}
	v := keys.Get(k)
	if v == nil {
		return Entry{}, nil
	}
	at, hash, err := decodeValue(k, v)
	if err != nil {
		return Entry{}, damaged(err)
	}
	return Entry{Applied: true, At: at, Hash: hash}, nil
}

// Check verifies the ledger in tx as a start with verify_on_start would:
// its buckets are there, every entry passes its checksum, and there are at
// least as many as its counter says. It returns the number of entries
// checked, or a *boltfile.DamagedError.
func Check(tx *bolt.Tx, path string) (uint64, error) {
	if _, _, _, err := ledgerBuckets(tx, path); err != nil {
		return 0, err
	}
	return check(tx, path)
}
