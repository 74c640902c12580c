package embedded

import (
	"bytes"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/bbolt"
)

// change is one write to broker.db: a put (value != nil), a delete, or, with
// prefix set, a delete of every key starting with key.
type change struct {
	bucket []byte
	key    []byte
	value  []byte
	prefix bool
}

// writer is the single committer of broker.db. Hooks enqueue changes in the
// order events happen; the committer applies everything queued so far in one
// fsync'd transaction. Invariants:
//   - changes commit in enqueue order, and a transaction holds a prefix of
//     the queue, so the file always shows a prefix of the broker's history;
//   - sync returns only after its changes, and all enqueued before them,
//     are committed;
//   - after a failed commit every later commit is refused (the file no longer
//     matches the broker's memory), so publishers are never acknowledged on
//     state that may be missing.
type writer struct {
	db  *bbolt.DB
	log *slog.Logger

	mu      sync.Mutex
	queue   []change
	waiters []chan error
	failed  error
	closed  bool

	wake chan struct{}
	done chan struct{}
}

func newWriter(db *bbolt.DB, log *slog.Logger) *writer {
	w := &writer{db: db, log: log, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go w.run()
	return w
}

// enqueue adds changes without waiting for them to be durable.
func (w *writer) enqueue(cs ...change) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return // the broker is shutting down; mochi no longer has this state either
	}
	w.queue = append(w.queue, cs...)
	w.signal()
}

// sync adds changes and waits until they are committed.
func (w *writer) sync(cs ...change) error {
	ch := make(chan error, 1)
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return fmt.Errorf("broker store %s is closed", w.db.Path())
	}
	if w.failed != nil {
		w.mu.Unlock()
		return w.failed
	}
	w.queue = append(w.queue, cs...)
	w.waiters = append(w.waiters, ch)
	w.signal()
	w.mu.Unlock()

	timer := time.NewTimer(syncTimeout)
	defer timer.Stop()
	select {
	case err := <-ch:
		return err
	case <-timer.C:
		return fmt.Errorf("commit to broker store %s took longer than %s (disk stalled?)", w.db.Path(), syncTimeout)
	}
}

func (w *writer) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// close commits what is queued and stops the committer.
func (w *writer) close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.signal()
	w.mu.Unlock()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed
}

// linger is how long the committer holds changes nobody waits for, hoping
// a waiter arrives to share the fsync: a publisher that waits for each
// PUBACK then costs one commit per message instead of two (its fan-out
// tail rides along with the next publish). Those changes are covered by
// fan-out records until committed, so delaying them loses nothing.
const linger = 2 * time.Millisecond

func (w *writer) run() {
	defer close(w.done)
	for range w.wake {
		for {
			w.lingerForWaiter()
			w.mu.Lock()
			batch, waiters, closed := w.queue, w.waiters, w.closed
			w.queue, w.waiters = nil, nil
			failed := w.failed
			w.mu.Unlock()

			if len(batch) == 0 && len(waiters) == 0 {
				if closed {
					return
				}
				break
			}
			err := failed
			if err == nil {
				err = w.commit(batch)
				if err != nil {
					err = fmt.Errorf("commit to broker store %s: %w; the broker refuses further publishes until restarted", w.db.Path(), err)
					w.log.Error("embedded broker store failed", "error", err)
					w.mu.Lock()
					w.failed = err
					w.mu.Unlock()
				}
			}
			for _, ch := range waiters {
				ch <- err
			}
		}
	}
}

// lingerForWaiter waits up to linger while only unwaited changes are queued.
func (w *writer) lingerForWaiter() {
	w.mu.Lock()
	idle := len(w.waiters) == 0 && len(w.queue) > 0 && !w.closed
	w.mu.Unlock()
	if !idle {
		return
	}
	timer := time.NewTimer(linger)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
			return
		case <-w.wake:
			w.mu.Lock()
			idle = len(w.waiters) == 0 && !w.closed
			w.mu.Unlock()
			if !idle {
				return
			}
		}
	}
}

func (w *writer) commit(batch []change) error {
	if len(batch) == 0 {
		return nil
	}
	return w.db.Update(func(tx *bbolt.Tx) error {
		for _, c := range batch {
			if c.bucket == nil {
				continue
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
		}
		return nil
	})
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
