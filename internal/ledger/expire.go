package ledger

import (
	"fmt"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/periodic"
	bolt "go.etcd.io/bbolt"
)

// maxBatchesPerRun bounds one expiry run, so a huge backlog of old keys is
// worked off over several runs instead of holding the writer for long.
const maxBatchesPerRun = 64

// expireLoop deletes keys older than the retention by the ledger clock
// (clock.go), oldest first, in bounded batches. It is the only code that
// deletes ledger keys. Without retention it still stores the clock's
// reading now and then, so that a retention set later counts the time.
func (l *Ledger) expireLoop() {
	defer close(l.expirerDone)
	every := l.opts.ExpireInterval
	if l.opts.Retention <= 0 {
		every = time.Minute
	}
	periodic.Run(l.closing, every, func() { _, _ = l.expireDue() })
}

// expireDue is one run of the expirer: the keys past retention by the
// ledger clock go, and the clock's reading is stored.
func (l *Ledger) expireDue() (int, error) {
	cutoff := l.now().Add(-l.opts.Retention)
	if l.opts.Retention <= 0 || cutoff.UnixNano() <= l.floor {
		return 0, l.saveClock() // expireBatch would not run to store it
	}
	return l.Expire(cutoff) // its transactions store the clock
}

// Expire deletes keys applied before cutoff, a ledger time (Clock), in
// batches of ExpireBatch, at most maxBatchesPerRun batches; nothing while
// cutoff is not past the clock's floor (clock.go). Keys claimed by an
// in-flight message are kept. It returns how many keys it deleted.
func (l *Ledger) Expire(cutoff time.Time) (int, error) {
	total := 0
	for range maxBatchesPerRun {
		if l.isClosed() {
			return total, ErrClosed
		}
		n, more, err := l.expireBatch(cutoff)
		total += n
		if err != nil {
			return total, fmt.Errorf("dedup ledger file %s: expiring keys: %w", l.path, err)
		}
		if !more {
			break
		}
	}
	return total, nil
}

// expireBatch deletes up to ExpireBatch keys older than cutoff in one
// transaction. more reports that the batch was full (there may be more).
func (l *Ledger) expireBatch(cutoff time.Time) (deleted int, more bool, err error) {
	if cutoff.UnixNano() <= l.floor {
		// Keys at or before the floor were stamped by another clock: they
		// have been held for less than retention of observed time.
		return 0, false, nil
	}
	limit := uint64(cutoff.UnixNano())
	stamp := l.now()
	err = l.file.Update(func(tx *bolt.Tx) error {
		if err := storeClock(tx, stamp); err != nil {
			return err
		}
		keys, times := tx.Bucket(bucketKeys), tx.Bucket(bucketTime)
		var stale [][]byte // time-index entries to delete
		c := times.Cursor()
		scanned := 0
		for k, _ := c.First(); k != nil && scanned < l.opts.ExpireBatch; k, _ = c.Next() {
			at, key, ok := splitTimeKey(k)
			if !ok || uint64(at) >= limit {
				break
			}
			scanned++
			if l.claimed(key) {
				continue
			}
			stale = append(stale, append([]byte(nil), k...))
		}
		// A full batch of which nothing could go (all claimed) ends this run:
		// rescanning the same entries would make no progress.
		more = scanned == l.opts.ExpireBatch && len(stale) > 0
		deleted = 0
		for _, tk := range stale {
			indexed, key, _ := splitTimeKey(tk) // every stale entry holds a time
			// The index entry may be older than the key's current entry
			// (re-applied after an earlier expiry): delete the key only if
			// this index entry is its own.
			if v := keys.Get(key); v != nil {
				// A damaged entry is kept: deleting it would forget the key.
				if at, _, err := decodeValue(key, v); err == nil && at.UnixNano() == indexed {
					if err := keys.Delete(key); err != nil {
						return err
					}
					deleted++
				}
			}
			if err := times.Delete(tk); err != nil {
				return err
			}
		}
		if deleted == 0 {
			return nil
		}
		return addCount(tx, -int64(deleted))
	})
	if err != nil {
		return 0, false, err
	}
	l.keys.Add(-int64(deleted))
	l.expired.Add(int64(deleted))
	return deleted, more, nil
}

func (l *Ledger) claimed(enc []byte) bool {
	return l.claims.Held(string(enc))
}
