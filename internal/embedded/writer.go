package embedded

import (
	"bytes"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/groupcommit"
)

// change is one write to broker.db: a put (value != nil), a delete, or, with
// prefix set, a delete of every key starting with key.
type change struct {
	bucket []byte
	key    []byte
	value  []byte
	prefix bool
}

// writer is the single committer of broker.db, a groupcommit loop. Hooks
// enqueue changes in the order events happen; the loop applies everything
// queued so far in one fsync'd transaction. Invariants:
//   - changes commit in enqueue order, and a transaction holds a prefix of
//     the queue, so the file always shows a prefix of the broker's history
//     (sends on reqs are ordered by turn, and the loop takes them in order);
//   - sync returns only after its changes, and all enqueued before them,
//     are committed;
//   - after a failed commit every later commit is refused (the file no longer
//     matches the broker's memory), so publishers are never acknowledged on
//     state that may be missing.
type writer struct {
	db  *bbolt.DB
	log *slog.Logger

	// turn is a lock (full: held) that orders the sends on reqs, and them
	// with close; a channel so that sync can give up waiting for it.
	turn   chan struct{}
	closed bool

	reqs    chan write
	closing chan struct{}
	done    chan struct{}

	failMu sync.Mutex // not turn: a sender may hold turn while the loop fails
	failed error

	writes int64 // bbolt's page writes counted into storeWritten so far; the loop's own
}

// storeWritten is what every broker store of the process wrote to its file
// and nobody has taken yet (TakeStoreWritten): page writes × page size.
var storeWritten atomic.Int64

// TakeStoreWritten returns the bytes the embedded brokers' stores wrote to
// their files since the previous call (bbolt's page writes × page size),
// so that whichever component reports it counts each byte once.
func TakeStoreWritten() int64 { return storeWritten.Swap(0) }

// countWritten adds the pages bbolt wrote since the last call to
// storeWritten.
func (w *writer) countWritten() {
	st := w.db.Stats()
	n := st.TxStats.GetWrite()
	storeWritten.Add((n - w.writes) * int64(w.db.Info().PageSize))
	w.writes = n
}

// write is one enqueue (done nil) or sync.
type write struct {
	changes []change
	done    chan error // buffered 1
}

// writerQueue bounds the writes waiting for the loop; a hook that finds it
// full waits for the commit in progress.
const writerQueue = 4096

func newWriter(db *bbolt.DB, log *slog.Logger) *writer {
	w := &writer{db: db, log: log, turn: make(chan struct{}, 1), reqs: make(chan write, writerQueue), closing: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// enqueue adds changes without waiting for them to be durable.
func (w *writer) enqueue(cs ...change) {
	w.turn <- struct{}{}
	defer func() { <-w.turn }()
	if w.closed {
		return // the broker is shutting down; mochi no longer has this state either
	}
	w.reqs <- write{changes: cs}
}

// sync adds changes and waits until they are committed.
func (w *writer) sync(cs ...change) error {
	timer := time.NewTimer(syncTimeout)
	defer timer.Stop()
	stalled := func() error {
		return fmt.Errorf("commit to broker store %s took longer than %s (disk stalled?)", w.db.Path(), syncTimeout)
	}
	req := write{changes: cs, done: make(chan error, 1)}
	select {
	case w.turn <- struct{}{}:
	case <-timer.C:
		return stalled()
	}
	if w.closed {
		<-w.turn
		return fmt.Errorf("broker store %s is closed", w.db.Path())
	}
	if err := w.failure(); err != nil {
		<-w.turn
		return err
	}
	select {
	case w.reqs <- req:
	case <-timer.C:
		<-w.turn
		return stalled()
	}
	<-w.turn
	select {
	case err := <-req.done:
		return err
	case <-timer.C:
		return stalled()
	}
}

func (w *writer) failure() error {
	w.failMu.Lock()
	defer w.failMu.Unlock()
	return w.failed
}

// close commits what is queued and stops the committer.
func (w *writer) close() error {
	w.turn <- struct{}{}
	if w.closed {
		<-w.turn
		return nil
	}
	w.closed = true // no send after this: what is in reqs is all there is
	close(w.closing)
	<-w.turn
	<-w.done
	return w.failure()
}

// linger is how long the committer holds changes nobody waits for, hoping
// a waiter arrives to share the fsync: a publisher that waits for each
// PUBACK then costs one commit per message instead of two (the removal of
// what a subscriber PUBACKed rides along with the next publish). Under a
// steady stream the next publish comes long before this passes; each commit
// costs at least a leaf, its branches and a meta page on the disk, so
// committing removals alone doubled the bytes written per message (flash
// wear, docs/operations.md). Those changes are covered by fan-out records
// until committed, so delaying them loses nothing: a power cut before they
// commit delivers a PUBACKed message again.
const linger = time.Second

func (w *writer) run() {
	defer close(w.done)
	loop := groupcommit.Loop[write]{Max: writerQueue, Linger: linger, Waits: func(r write) bool { return r.done != nil }}
	loop.Run(w.reqs, w.closing, w.commitGroup)
	// Closed: nothing is sent any more; commit what is left.
	var rest []write
	for len(w.reqs) > 0 {
		rest = append(rest, <-w.reqs)
	}
	if len(rest) > 0 {
		w.commitGroup(rest)
	}
}

// commitGroup commits the changes of group in order (or refuses them after
// a failure) and answers every sync in it.
func (w *writer) commitGroup(group []write) {
	err := w.failure()
	if err == nil {
		err = w.commit(group)
		if err != nil {
			err = fmt.Errorf("commit to broker store %s: %w; the broker refuses further publishes until restarted", w.db.Path(), err)
			w.log.Error("embedded broker store failed", "error", err)
			w.failMu.Lock()
			w.failed = err
			w.failMu.Unlock()
		}
	}
	for _, r := range group {
		if r.done != nil {
			r.done <- err
		}
	}
}

func (w *writer) commit(group []write) error {
	n := 0
	for _, r := range group {
		n += len(r.changes)
	}
	if n == 0 {
		return nil // only syncs: everything before them is committed
	}
	defer w.countWritten()
	return w.db.Update(func(tx *bbolt.Tx) error {
		for _, r := range group {
			for _, c := range r.changes {
				if err := apply(tx, c); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// apply writes one change inside tx.
func apply(tx *bbolt.Tx, c change) error {
	if c.bucket == nil {
		return nil
	}
	b := tx.Bucket(c.bucket)
	var err error
	switch {
	case c.prefix:
		err = deletePrefix(b, c.key)
	case c.value == nil:
		err = b.Delete(c.key)
	default:
		err = b.Put(c.key, c.value)
	}
	if err != nil {
		return fmt.Errorf("bucket %s key %q: %w", c.bucket, c.key, err)
	}
	return nil
}

func deletePrefix(b *bbolt.Bucket, prefix []byte) error {
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}
