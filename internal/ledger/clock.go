package ledger

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledgerclock"
)

// Keys are stamped, and expire, by the ledger clock (internal/ledgerclock):
// the reading stored in ledger/meta plus the monotonic time this process
// observed since it opened the file. No step of the wall clock moves it, so
// a key is deleted only after retention of time the ledger itself saw pass
// (time while no process had the file open does not count).
//
// Invariant: the stored reading is at least every stamp in the file. Every
// transaction that stamps a key stores the reading it stamped with (put),
// and the expirer and Close store the reading they got to; so after a
// crash the clock restarts no earlier than any key.
//
// Invariant: no key stamped at or before the floor is deleted until the
// clock has passed floor+retention (expireBatch). A file whose keys were
// stamped by something other than this clock (written before the ledger
// clock existed, or by an older build) gets a new reading and floor: the
// newest stamp or the wall clock, whichever is later. Its keys then live
// retention of observed time from that moment, never less, and still
// expire: the file does not grow for ever.
var (
	keyClock = []byte("clock")       // ledger time of the last store, Unix nanos (8, BE)
	keyFloor = []byte("clock floor") // see above (8, BE)
)

// startClock reads the stored clock, or starts one (see above), and stores
// what it started.
func (l *Ledger) startClock() error {
	return l.file.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		last, _ := tx.Bucket(bucketTime).Cursor().Last()
		newest, _, _ := splitTimeKey(last) // 0 when the index is empty
		reading, floor := int64(boltfile.Uint64(meta, keyClock)), int64(boltfile.Uint64(meta, keyFloor))
		if meta.Get(keyClock) == nil || newest > reading {
			reading = ledgerclock.Start(l.opts.Clock, newest)
			floor = reading
			if err := boltfile.PutUint64(meta, keyFloor, uint64(floor)); err != nil {
				return err
			}
		}
		l.clock, l.floor = ledgerclock.New(l.opts.Clock, reading), floor
		return boltfile.PutUint64(meta, keyClock, uint64(reading))
	})
}

// now is the ledger time, for a stamp or a cutoff.
func (l *Ledger) now() time.Time { return time.Unix(0, l.clock.Now()) }

// storeClock stores reading in tx unless a later one is stored.
func storeClock(tx *bolt.Tx, reading time.Time) error {
	meta := tx.Bucket(bucketMeta)
	if v := reading.UnixNano(); meta.Get(keyClock) == nil || int64(boltfile.Uint64(meta, keyClock)) < v {
		return boltfile.PutUint64(meta, keyClock, uint64(v))
	}
	return nil
}

// saveClock stores the clock's reading now (the expirer's ticks, Close), so
// that the time a process observed without stamping a key still counts.
func (l *Ledger) saveClock() error {
	return l.file.Update(func(tx *bolt.Tx) error { return storeClock(tx, l.now()) })
}

// Clock returns the ledger time now: the time keys are stamped with, and
// expire by (retention before it). It drifts from the wall clock by what
// the wall clock was wrong by when the file was started, plus the time no
// process had it open.
func (l *Ledger) Clock() time.Time { return l.now() }
