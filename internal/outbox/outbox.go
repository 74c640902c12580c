// Package outbox is the durable FIFO behind reliable_mqtt_out: records are
// written to a bbolt file (fsync'd) before the writer is told they are
// accepted, and a sender delivers them in order and removes each one after
// its confirmation.
//
// Invariant: a record leaves the outbox only through Remove, which the sender
// calls after the record's confirmation. Nothing else ever deletes a record —
// not Open, not Close, not a corrupt neighbour, not a failed commit.
//
// Layout, in a file shared through boltfile (so a dedup ledger can live in
// the same file and commit in the same transaction):
//
//	outbox/records  seq (8-byte big-endian) -> record value (record.go)
//	outbox/ids      event ID -> seq
//	outbox/meta     "pending", "pending_bytes", "damaged", "format" (8-byte
//	                big-endian), "client_id", "checksums" (present: every
//	                record has one)
//	outbox/damaged  seq -> a record value set aside: it failed its checksum
//	                (damaged.go), or an older release did not read its
//	                version; Restore puts back what reads (setaside.go)
package outbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/failpoint"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/registry"
	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
)

var (
	bucketRecords = []byte("outbox/records")
	bucketIDs     = []byte("outbox/ids")
	bucketMeta    = []byte("outbox/meta")

	keyPending      = []byte("pending")
	keyPendingBytes = []byte("pending_bytes")
	keyClientID     = []byte("client_id")
)

// ErrEventIDConflict means the event ID is already pending with a different
// topic, payload or properties.
var ErrEventIDConflict = errors.New("event ID conflict")

// ErrClosed is returned by calls on a closed outbox.
var ErrClosed = errors.New("outbox closed")

// ErrCorrupt marks a stored record that cannot be decoded.
var ErrCorrupt = errors.New("corrupt outbox record")

// IsDamaged reports whether err says that the outbox file is damaged (a
// page bbolt cannot read, records lost from the queue): retrying does not
// help, an operator must move the file aside.
func IsDamaged(err error) bool { return errors.Is(err, boltfile.ErrDamaged) }

// closeTimeout bounds how long Close waits for a commit in progress.
const closeTimeout = shutdown.Commit

// Entry is what a writer appends: an event (its Retained flag is not
// stored) and what commits with it.
type Entry struct {
	mqttmsg.Event

	// Participants run inside the append transaction, before commit, so
	// another component (the dedup ledger) can commit its own state in the
	// same bbolt transaction. They also run when the event ID is already
	// pending with identical content. A participant returning commit.ErrAlreadyApplied means
	// "the effect already happened": nothing is appended and Append returns
	// nil with Seq 0. Any other error fails only this entry: the group's
	// transaction is rolled back and redone without it.
	Participants []func(tx *bolt.Tx) error
}

// Options tune an outbox.
type Options struct {
	// SameProps reports whether a write's properties are the pending
	// record's, for a write of an event ID already pending; nil compares
	// them exactly. (A tracer's traceparent differs on every write of one
	// event.)
	SameProps func(stored, written *mqttmsg.Properties) bool
	// SamePayload reports whether a write's payload is the pending record's,
	// for a write of an event ID already pending; nil compares the bytes.
	// (A reliomq v1 envelope with a trace context differs on every write of
	// one event: codec.SamePayload.)
	SamePayload func(stored, written []byte) bool
	// MaxPending bounds the number of records; 0 = unbounded. Append blocks
	// while the outbox is full (backpressure, never a drop).
	MaxPending int
	// MaxPendingBytes bounds event ID + topic + payload bytes; 0 = unbounded.
	// A single entry larger than the bound is admitted when the outbox is
	// otherwise empty, so it cannot wait forever.
	MaxPendingBytes int64
	// MaxBatch bounds the records (and removals) per transaction; default 1024.
	MaxBatch int
	// CommitDelay: an append's commit waits up to this long for more
	// appends to share its transaction (fewer commits, fewer bytes written
	// to the disk, each append's latency up to this much longer); 0 commits
	// what is waiting at once.
	CommitDelay time.Duration
	// Verify: when to check the file's structure at open (boltfile.Verify;
	// the zero value is auto).
	Verify boltfile.Verify
	// OnDamaged, if set, is told about each record moved aside as damaged,
	// after the move is committed. It runs on the committer: keep it short.
	OnDamaged func(DamagedRecord)
}

// Stats describes the backlog. Kept in memory and in outbox/meta, never
// computed by scanning.
type Stats struct {
	Pending      int
	PendingBytes int64
	Oldest       time.Time // zero if empty
	Damaged      int64     // records moved to outbox/damaged, ever (never published)
}

// Outbox is a durable FIFO in one bbolt file. Safe for concurrent use.
type Outbox struct {
	file     *boltfile.File
	db       *bolt.DB
	path     string
	opts     Options
	clientID string

	reqs          chan []*request // a submission; unbuffered: a send succeeds only while the committer runs
	closing       chan struct{}
	committerDone chan struct{}
	closeOnce     sync.Once
	closeErr      error
	appended      chan struct{}

	mu            sync.Mutex
	stats         Stats // committed state; written only by the committer
	reservedN     int   // admitted appends not yet committed
	reservedBytes int64
	freed         chan struct{} // closed and replaced whenever space is freed
	spaceWaiters  int           // appends waiting in reserve for space
}

// outboxes holds the process's open outboxes by file path: one per file,
// never shared, since two senders would deliver and remove the same records.
var outboxes registry.Registry[*Outbox]

// Open opens (or creates) the outbox in the bbolt file at path. The file's
// directory must exist.
func Open(path string, opts Options) (*Outbox, error) {
	if opts.MaxPending < 0 || opts.MaxPendingBytes < 0 || opts.MaxBatch < 0 || opts.CommitDelay < 0 {
		return nil, fmt.Errorf("outbox file %s: max_pending, max_pending_bytes, max batch and commit_delay must not be negative", path)
	}
	if opts.MaxBatch == 0 {
		opts.MaxBatch = 1024
	}
	// A rolled-back outbox is opened and reported (MetaDamage), not
	// refused: at worst it resends confirmed records, or misses the last
	// group appended, and refusing would stop the records it does hold.
	f, err := boltfile.AcquireWith(path, boltfile.Options{Verify: opts.Verify, AcceptRollback: true, Create: func(tx *bolt.Tx) error {
		_, err := layout.CreateIn(tx)
		return err
	}})
	if err != nil {
		return nil, fmt.Errorf("opening outbox: %w", err)
	}
	refuse := func(*Outbox) error {
		return fmt.Errorf("outbox file %s is already used by another reliable_mqtt_out in this process; give each output its own outbox path", f.Path())
	}
	o, err := outboxes.Acquire(f.Path(), refuse, func() (*Outbox, error) { return open(f, opts) })
	if err != nil {
		_ = f.Release()
		return nil, err
	}
	return o, nil
}

// open starts the outbox in the file f.
func open(f *boltfile.File, opts Options) (*Outbox, error) {
	o := &Outbox{
		file:          f,
		db:            f.DB(),
		path:          f.Path(),
		opts:          opts,
		reqs:          make(chan []*request),
		closing:       make(chan struct{}),
		committerDone: make(chan struct{}),
		appended:      make(chan struct{}, 1),
		freed:         make(chan struct{}),
	}
	if err := o.load(); err != nil {
		return nil, err
	}
	go o.commitLoop()
	return o, nil
}

// section is the outbox's part of a shared file. An existing outbox is not
// written at open, so it can be opened and drained on a full disk — except
// once, to add checksums to the records of a file written before they
// existed.
func (o *Outbox) section() boltfile.Section {
	s := layout
	s.Check, s.Upgrade, s.Verify = o.checkPending, o.upgradeRecords, o.checkCount
	return s
}

// layout is the outbox's buckets, created with its client ID. Its format
// is the newest record version (record.go).
var layout = boltfile.Section{
	Name:     "outbox",
	Format:   Format,
	Buckets:  [][]byte{bucketRecords, bucketIDs, bucketMeta},
	Init:     initClientID,
	Complete: func(meta *bolt.Bucket) bool { return meta.Get(keyClientID) != nil },
}

// checkPending: the pending counter moves with the records, so a counter
// without them is damage. It also refuses a queue whose ends hold a record
// of a newer version (a verified start checks every record: checkKeys).
func (o *Outbox) checkPending(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	c := tx.Bucket(bucketRecords).Cursor()
	for _, end := range []func() ([]byte, []byte){c.First, c.Last} {
		if k, v := end(); k != nil {
			if err := newerRecord(o.path, k, v); err != nil {
				return err
			}
		}
	}
	if k, _ := c.First(); k == nil && boltfile.Uint64(meta, keyPending) > 0 {
		return &boltfile.DamagedError{Path: o.path, Cause: fmt.Sprintf("its counter says %d outbox records are pending but the records bucket is empty: they were lost to damage", boltfile.Uint64(meta, keyPending))}
	}
	return nil
}

// load readies the outbox's buckets (section) and reads the counters and
// client ID.
func (o *Outbox) load() error {
	if err := o.file.OpenSection(o.section()); err != nil {
		return err
	}
	return o.file.View(func(tx *bolt.Tx) error {
		o.loadFrom(tx.Bucket(bucketRecords), tx.Bucket(bucketMeta))
		return nil
	})
}

// initClientID generates the MQTT client ID of a new outbox, once.
func initClientID(meta *bolt.Bucket) error {
	if meta.Get(keyClientID) != nil {
		return nil
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	return meta.Put(keyClientID, []byte("reliable-mqtt-"+hex.EncodeToString(b[:])))
}

func (o *Outbox) loadFrom(records, meta *bolt.Bucket) {
	o.stats.Pending = int(boltfile.Uint64(meta, keyPending))
	o.stats.PendingBytes = int64(boltfile.Uint64(meta, keyPendingBytes))
	o.stats.Damaged = int64(boltfile.Uint64(meta, keyDamaged))
	if _, v := records.Cursor().First(); v != nil {
		o.stats.Oldest, _ = enqueuedOf(v)
	}
	o.clientID = string(meta.Get(keyClientID))
}

// reloadStatsLocked rereads the counters and the oldest record from the
// file. Caller holds mu.
func (o *Outbox) reloadStatsLocked() {
	_ = o.file.View(func(tx *bolt.Tx) error {
		o.stats = Stats{}
		o.loadFrom(tx.Bucket(bucketRecords), tx.Bucket(bucketMeta))
		return nil
	})
}

// WrittenBytes is what bbolt wrote to the outbox's file since this process
// opened it (boltfile.File.WrittenBytes); a ledger sharing the file adds
// to the same figure.
func (o *Outbox) WrittenBytes() int64 { return o.file.WrittenBytes() }

// Path returns the outbox file's absolute path.
func (o *Outbox) Path() string { return o.path }

// MetaDamage reports a damaged meta page found when the file was opened
// (the file may have lost its last commit), or nil. Callers report it.
func (o *Outbox) MetaDamage() *boltfile.MetaDamage { return o.file.MetaDamage() }

// CompactionSkipped returns why the compaction due at open failed (the
// file is used as it was, at its old size), or nil.
func (o *Outbox) CompactionSkipped() error { return o.file.CompactionSkipped() }

// ClientID returns the MQTT client ID generated once for this file.
func (o *Outbox) ClientID() (string, error) { return o.clientID, nil }

// Appended is signalled after each commit that added records.
func (o *Outbox) Appended() <-chan struct{} { return o.appended }

// Stats returns the committed backlog. O(1).
func (o *Outbox) Stats() Stats {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stats
}

// Append stores e and returns after it is committed to disk. An event ID
// already pending with the same topic and payload returns the pending
// record; with different content it fails with ErrEventIDConflict. While
// the outbox is full Append waits for space until ctx is done (a retried
// duplicate waits too: admission happens before the index is consulted).
// Once the committer has taken the entry, Append waits for the commit's
// result whatever ctx does: nil means "on disk" (Seq 0: skipped by a
// participant), an error means "not known to be on disk". Almost always that
// is "not appended"; only a commit whose fsync failed after its pages were
// written leaves the record present anyway, so a retry may store it twice
// (or find it, under the same event ID) — a duplicate, never a loss.
func (o *Outbox) Append(ctx context.Context, e Entry) (Record, error) {
	recs, errs := o.AppendBatch(ctx, []Entry{e})
	return recs[0], errs[0]
}

// AppendEach appends, in one AppendBatch, entries[i] for every i whose
// errs[i] is nil, and stores each failure in errs[i], naming the event and
// the file.
func (o *Outbox) AppendEach(ctx context.Context, entries []Entry, errs []error) {
	run := make([]Entry, 0, len(entries))
	index := make([]int, 0, len(entries))
	for i, e := range entries {
		if errs[i] == nil {
			run, index = append(run, e), append(index, i)
		}
	}
	_, runErrs := o.AppendBatch(ctx, run)
	for j, err := range runErrs {
		if err != nil {
			errs[index[j]] = fmt.Errorf("event %s not stored in outbox %s: %w", run[j].EventID, o.path, err)
			continue
		}
		failpoint.Hit(failpoint.OutboxAppended)
	}
}

// AppendBatch appends entries in their order and returns when every one has
// its result: recs[i] and errs[i] are what Append would return for
// entries[i]. The entries admitted together reach the committer as one
// submission, so they share transactions (and fsyncs) instead of queueing
// one by one. While the outbox is full the entries are admitted as space
// frees up, in runs: a run never waits for space while holding a
// reservation, so a batch larger than max_pending still goes through.
func (o *Outbox) AppendBatch(ctx context.Context, entries []Entry) (recs []Record, errs []error) {
	recs, errs = make([]Record, len(entries)), make([]error, len(entries))
	reqs := make([]request, len(entries))
	run := make([]*request, 0, len(entries))
	done := make(chan struct{}, len(entries))
	for next := 0; next < len(entries); {
		run = run[:0]
		for ; next < len(entries); next++ {
			e := &entries[next]
			if e.EventID == "" {
				errs[next] = fmt.Errorf("outbox file %s: entry has an empty event ID", o.path)
				continue
			}
			if err := ctx.Err(); err != nil {
				errs[next] = fmt.Errorf("outbox file %s: nothing appended: %w", o.path, err)
				continue
			}
			sz := size(e.EventID, e.Topic, encodeProps(e.Props), e.Payload)
			if len(run) == 0 {
				if err := o.reserve(ctx, sz); err != nil {
					errs[next] = err
					continue
				}
			} else if !o.tryReserve(sz) {
				break // commit this run first: its records may be what frees space
			}
			reqs[next] = request{ctx: ctx, entry: e, size: sz, done: done}
			run = append(run, &reqs[next])
		}
		if len(run) == 0 {
			continue
		}
		select {
		case o.reqs <- run:
		case <-o.closing:
			for _, r := range run {
				o.unreserve(r.size)
				r.settled, r.err = true, fmt.Errorf("outbox file %s: %w", o.path, ErrClosed)
			}
			continue
		}
		// Once handed over every result is awaited: the committer answers
		// every request it took, and the caller must learn whether it
		// committed.
		for range run {
			<-done
		}
	}
	for i := range reqs {
		if reqs[i].entry != nil {
			recs[i], errs[i] = reqs[i].rec, reqs[i].err
		}
	}
	return recs, errs
}

// Read returns up to max records with Seq > afterSeq, oldest first. A
// record that fails its checksum is not returned: it is moved aside (see
// damaged.go) before Read returns, and the records after it are read on.
func (o *Outbox) Read(afterSeq uint64, max int) ([]Record, error) {
	if max <= 0 {
		return nil, fmt.Errorf("outbox file %s: Read max must be positive, got %d", o.path, max)
	}
	if afterSeq == ^uint64(0) {
		return nil, nil
	}
	if o.isClosed() {
		return nil, fmt.Errorf("outbox file %s: %w", o.path, ErrClosed)
	}
	var out []Record
	var bad []suspect
	err := o.file.View(func(tx *bolt.Tx) error {
		records := tx.Bucket(bucketRecords)
		c := records.Cursor()
		var prev []byte
		k, v := c.Seek(seqKey(afterSeq + 1))
		for ; k != nil && len(out) < max; k, v = c.Next() {
			if prev != nil && bytes.Compare(k, prev) <= 0 {
				return outOfOrder(o.path, k, prev)
			}
			prev = k
			view, err := decodeRecord(k, v, false)
			if format.IsNewer(err) {
				// Never set aside. The records before it go out first;
				// the next Read starts at it and fails.
				if len(out) > 0 || len(bad) > 0 {
					return nil
				}
				return newerRecord(o.path, k, v)
			}
			if err != nil {
				bad = append(bad, suspect{key: append([]byte(nil), k...), reason: err.Error()})
				continue
			}
			out = append(out, view.record(seqFromKey(k)))
		}
		if k == nil {
			// At the end the bucket is small (what is in flight), so
			// walking it is cheap: fewer records than the counter says
			// were dropped from a damaged page without a read failing, and
			// a key out of order anywhere may have been skipped by a seek.
			return checkKeys(o.path, records, tx.Bucket(bucketMeta))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading outbox file %s: %w", o.path, err)
	}
	if len(bad) > 0 {
		if err := o.setAside(bad); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// setAside has the committer move damaged records out of the queue.
func (o *Outbox) setAside(bad []suspect) error {
	r := &request{ctx: context.Background(), aside: bad, done: make(chan struct{}, 1)}
	err := o.submit(r)
	if err != nil && r.err != nil { // not the closed outbox: the move failed
		return fmt.Errorf("outbox file %s: moving %d damaged records aside: %w", o.path, len(bad), err)
	}
	return err
}

// Remove deletes confirmed records and their event-ID index entries. Seqs
// that are not pending are ignored. Only the sender calls it, after each
// record's confirmation (see the package invariant).
//
// On a full disk a removal that touches many pages can need more new pages
// than the file has free (bbolt copies every page it changes), while the
// same records removed a few at a time fit, and each commit frees pages for
// the next. So a removal that fails for want of space is split in halves
// until it commits or one record alone does not fit. (One record can still
// not fit: removing it from a leaf rewrites the leaf, and bbolt needs a run
// of free pages as long as the new leaf. The sender retries; in-order
// removals, which empty whole leaves, then make room.)
func (o *Outbox) Remove(seqs ...uint64) error {
	if len(seqs) == 0 {
		return nil
	}
	err := o.remove1(seqs)
	if len(seqs) > 1 && errors.Is(err, syscall.ENOSPC) {
		// In order, each half is a run of neighbours, whose removal
		// empties whole leaves instead of rewriting them.
		seqs = slices.Sorted(slices.Values(seqs))
		half := len(seqs) / 2
		if err := o.Remove(seqs[:half]...); err != nil {
			return err
		}
		return o.Remove(seqs[half:]...)
	}
	return err
}

// remove1 submits one removal of seqs, committed in one transaction.
func (o *Outbox) remove1(seqs []uint64) error {
	return o.submit(&request{ctx: context.Background(), seqs: seqs, done: make(chan struct{}, 1)})
}

// submit hands r to the committer and waits for its outcome.
func (o *Outbox) submit(r *request) error {
	select {
	case o.reqs <- []*request{r}:
	case <-o.closing:
		return fmt.Errorf("outbox file %s: %w", o.path, ErrClosed)
	}
	<-r.done
	return r.err
}

// Close stops the committer and releases the file. Appends waiting for
// space or not yet taken by the committer fail with ErrClosed; a commit in
// progress finishes first (bounded by closeTimeout).
func (o *Outbox) Close() error {
	o.closeOnce.Do(func() {
		close(o.closing)
		if !shutdown.Wait(closeTimeout, o.committerDone) {
			o.closeErr = fmt.Errorf("outbox file %s: a commit did not finish within %s; the file is left open", o.path, closeTimeout)
			return
		}
		o.unregister()
		if err := o.file.Release(); err != nil {
			o.closeErr = fmt.Errorf("closing outbox: %w", err)
		}
	})
	return o.closeErr
}

func (o *Outbox) isClosed() bool { return shutdown.Closed(o.closing) }

func (o *Outbox) unregister() { outboxes.Release(o.path, o) }

// CorruptRecordError names a stored record that cannot be decoded. It is
// errors.Is ErrCorrupt. Read no longer returns it (a damaged record is moved
// aside, see damaged.go); it is kept for callers that still check for it.
type CorruptRecordError struct {
	Path string
	Seq  uint64
	Err  error
}

func (e *CorruptRecordError) Error() string {
	return fmt.Sprintf("outbox file %s: record seq %d: %v (%v)", e.Path, e.Seq, ErrCorrupt, e.Err)
}

func (e *CorruptRecordError) Unwrap() error { return ErrCorrupt }
