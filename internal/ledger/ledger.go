// Package ledger is the dedup ledger behind dedup_ledger: a durable set of
// "applied" keys in a bbolt file, with in-memory claims (internal/claims)
// for keys whose message is still in flight. Its committer is a groupcommit
// loop; what dedup_ledger decides for a copy is internal/dedup.
//
// Invariant: a key is written to the ledger only when its message's effect
// is committed — by Claim.Commit (after the pipeline acknowledged the
// message) or by Claim.Apply inside the transaction that writes the effect
// (the outbox append on the same file). Nothing else writes a key; the
// expirer is the only code that deletes one.
//
// Invariant: at most one claim per key exists at a time, so two copies of
// one key in flight can never both pass. A second copy waits for the first
// claim to settle: committed makes it a duplicate, released lets it claim.
//
// Layout, in a file shared through boltfile (the outbox may live in the same
// file and commit ledger entries in its own transaction):
//
//	ledger/keys  encoded key -> version(2) | applied, ledger time (clock.go) in unix nanos (8, BE) | sha256 of payload (32) |
//	             CRC-32C (4, BE) of the encoded key followed by the 41 bytes before it
//	ledger/time  applied unix nanos (8, BE) | encoded key -> empty   (retention index, oldest first)
//	ledger/meta  "count" -> number of keys (8, BE); "checksums" (present: every entry has one);
//	             "format" -> the entry version this ledger is written in (8, BE; newer: refused);
//	             "clock", "clock floor" (clock.go)
//
// Version 1 entries (no checksum, written before checksums existed) are
// rewritten at the first open (upgradeEntries); after that a version-1
// entry is damage. An entry that fails its checksum is never read as "not
// applied": every call that meets it fails with an error naming it.
package ledger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledgerclock"
	"github.com/reliable-mqtt/reliable-mqtt/internal/registry"
	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
)

var (
	bucketKeys = []byte("ledger/keys")
	bucketTime = []byte("ledger/time")
	bucketMeta = []byte("ledger/meta")

	keyCount = []byte("count")
)

const (
	valueVersionV1 = 1
	valueLenV1     = 1 + 8 + 32
	valueVersion   = 2
	valueLen       = valueLenV1 + 4

	// MaxKeyBytes bounds namespace + key, far below bbolt's 32 KiB key limit.
	MaxKeyBytes = 4096
)

// closeTimeout bounds how long Close waits for a commit in progress.
const closeTimeout = shutdown.Commit

// ErrClosed is returned by calls on a closed ledger.
var ErrClosed = errors.New("ledger closed")

// Options tune a ledger. Processors sharing a file must agree on them.
type Options struct {
	// Retention: applied keys older than this are deleted in the
	// background. 0 keeps keys forever.
	Retention time.Duration
	// ExpireBatch bounds the keys deleted per transaction; default 1000.
	ExpireBatch int
	// ExpireInterval is how often the expirer runs; default Retention/4,
	// between 50ms and 1m.
	ExpireInterval time.Duration
	// MaxBatch bounds the keys committed per transaction; default 1024.
	MaxBatch int
	// Verify: when to check the file's structure and every entry's
	// checksum at open (boltfile.Verify; the zero value is auto).
	Verify boltfile.Verify
	// AcceptRollback opens a file whose newest meta page is damaged, i.e.
	// that may have forgotten the keys of its last commit (those events
	// would be applied again). Without it Open refuses such a file.
	AcceptRollback bool
	// Clock is where the ledger clock reads time (clock.go); the zero
	// value is the system's. For tests.
	Clock ledgerclock.Source
}

func (o *Options) defaults() {
	if o.ExpireBatch <= 0 {
		o.ExpireBatch = 1000
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 1024
	}
	if o.ExpireInterval <= 0 && o.Retention > 0 {
		o.ExpireInterval = min(max(o.Retention/4, 50*time.Millisecond), time.Minute)
	}
}

// Stats counts what the ledger did since it was opened (Keys: now).
type Stats struct {
	Keys    int64 // applied keys stored in the file
	Commits int64 // keys written by Commit or Apply
	// Transactions counts the ledger's own commit transactions (Commit and
	// CommitAll, group-committed), not the writers' that Apply joins.
	Transactions int64
	Expired      int64 // keys deleted by retention
	// WrittenBytes is what bbolt wrote to the file since this process
	// opened it (boltfile.File.WrittenBytes); an outbox sharing the file
	// adds to the same figure.
	WrittenBytes int64
}

// Ledger is the applied-key set of one bbolt file. One Ledger per file per
// process (Open shares it), because the in-flight claims must be seen by
// every processor thread. Safe for concurrent use.
type Ledger struct {
	file *boltfile.File

	writtenMu    sync.Mutex
	writtenTaken int64 // WrittenBytes at the last TakeWritten
	db           *bolt.DB
	path         string
	opts         Options

	claims *claims.Table // keys claimed, not yet settled; closed with closing

	clock *ledgerclock.Clock // what keys are stamped and expire by (clock.go)
	floor int64              // no key expires before floor+retention (clock.go)

	keys         atomic.Int64
	commits      atomic.Int64
	expired      atomic.Int64
	transactions atomic.Int64 // the committer's transactions

	reqs          chan *commitReq // unbuffered: a send succeeds only while the committer runs
	closing       chan struct{}
	committerDone chan struct{}
	expirerDone   chan struct{}
}

// ledgers holds the process's open ledgers by file path.
var ledgers registry.Registry[*Ledger]

// Open opens the ledger in the bbolt file at path (creating its buckets),
// or joins the one this process already has open. Every Open needs a Close.
func Open(path string, opts Options) (*Ledger, error) {
	if opts.Retention < 0 || opts.ExpireBatch < 0 || opts.MaxBatch < 0 {
		return nil, fmt.Errorf("ledger file %s: retention and batch sizes must not be negative", path)
	}
	opts.defaults()
	f, err := boltfile.AcquireWith(path, boltfile.Options{Verify: opts.Verify, AcceptRollback: opts.AcceptRollback, Create: func(tx *bolt.Tx) error {
		_, err := layout.CreateIn(tx)
		return err
	}})
	if err != nil {
		return nil, fmt.Errorf("opening dedup ledger: %w", err)
	}
	joined := false
	join := func(l *Ledger) error {
		joined = true
		if l.opts.Retention != opts.Retention {
			return fmt.Errorf("dedup ledger file %s is already open in this process with retention %s; every dedup_ledger on one file must use the same retention (asked for %s)", l.path, l.opts.Retention, opts.Retention)
		}
		return nil
	}
	l, err := ledgers.Acquire(f.Path(), join, func() (*Ledger, error) { return open(f, opts) })
	if joined || err != nil {
		_ = f.Release() // a shared ledger keeps its own handle
	}
	return l, err
}

// open starts the ledger in the file f, which it then owns.
func open(f *boltfile.File, opts Options) (*Ledger, error) {
	l := &Ledger{
		file:          f,
		db:            f.DB(),
		path:          f.Path(),
		opts:          opts,
		reqs:          make(chan *commitReq),
		closing:       make(chan struct{}),
		committerDone: make(chan struct{}),
		expirerDone:   make(chan struct{}),
	}
	l.claims = claims.New(l.closing)
	if err := l.load(); err != nil {
		return nil, err
	}
	go l.commitLoop()
	go l.expireLoop()
	return l, nil
}

// layout is the ledger's buckets in a shared file.
var layout = boltfile.Section{
	Name:    "dedup ledger",
	Format:  valueVersion,
	Buckets: [][]byte{bucketKeys, bucketTime, bucketMeta},
	Check:   checkEnds,
}

// checkEnds refuses, at open, a ledger whose first or last entry is of a
// newer version (a verified start checks every entry: check).
func checkEnds(tx *bolt.Tx) error {
	c := tx.Bucket(bucketKeys).Cursor()
	for _, end := range []func() ([]byte, []byte){c.First, c.Last} {
		if k, v := end(); k != nil {
			if err := newerEntry(tx.DB().Path(), k, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// newerEntry returns a *format.NewerError if the entry under k is of a
// version newer than this build reads: not damage, never read as "not
// applied".
func newerEntry(path string, k, v []byte) error {
	return format.Check(path, fmt.Sprintf("dedup ledger entry %q", k), uint64(firstByte(v)), valueVersion)
}

// load readies the ledger's buckets (creating them in a file that has none:
// a ledger added to an outbox's file, upgrading entries written before
// checksums, verifying every entry if the file was verified) and reads the
// key count.
func (l *Ledger) load() error {
	s := layout
	s.Upgrade, s.Verify = l.upgradeEntries, l.verifyEntries
	if err := l.file.OpenSection(s); err != nil {
		return err
	}
	if err := l.startClock(); err != nil {
		return fmt.Errorf("dedup ledger file %s: starting its clock: %w", l.path, err)
	}
	return l.file.View(func(tx *bolt.Tx) error {
		l.keys.Store(int64(boltfile.Uint64(tx.Bucket(bucketMeta), keyCount)))
		return nil
	})
}

// Path returns the ledger file's absolute path: the identity a transaction
// participant must name (the same as outbox.Outbox.Path for that file).
func (l *Ledger) Path() string { return l.path }

// Retention returns the configured retention (0: forever).
func (l *Ledger) Retention() time.Duration { return l.opts.Retention }

// Stats returns the key count and counters. O(1).
func (l *Ledger) Stats() Stats {
	return Stats{Keys: l.keys.Load(), Commits: l.commits.Load(), Expired: l.expired.Load(), Transactions: l.transactions.Load(), WrittenBytes: l.file.WrittenBytes()}
}

// TakeWritten returns the bytes bbolt wrote to the file (WrittenBytes)
// since the previous call, so that every processor thread sharing this
// ledger can feed one counter without counting a byte twice.
func (l *Ledger) TakeWritten() int64 {
	l.writtenMu.Lock()
	defer l.writtenMu.Unlock()
	now := l.file.WrittenBytes()
	n := now - l.writtenTaken
	l.writtenTaken = max(now, l.writtenTaken)
	return max(n, 0)
}

// Close gives up this reference. The last Close stops the committer and
// the expirer, releases every claim still held (their messages never
// finished) and releases the file.
func (l *Ledger) Close() error {
	if !ledgers.Release(l.path, l) {
		return nil // other users remain, or already closed
	}
	close(l.closing)
	if !shutdown.Wait(closeTimeout, l.committerDone, l.expirerDone) {
		return fmt.Errorf("dedup ledger file %s: a commit did not finish within %s; the file is left open", l.path, closeTimeout)
	}
	for _, h := range l.claims.Holds() {
		h.Settle(claims.Released)
	}
	clockErr := l.saveClock()
	if err := l.file.Release(); err != nil {
		return fmt.Errorf("closing dedup ledger: %w", err)
	}
	if clockErr != nil {
		return fmt.Errorf("dedup ledger file %s: storing its clock at close (the time since its last commit or expiry run is not counted): %w", l.path, clockErr)
	}
	return nil
}

// Lookup reports whether key is applied, and with which payload hash. For
// tests and tools; the pipeline uses Claim.
func (l *Ledger) Lookup(key claims.Key) (applied bool, hash [32]byte, at time.Time, err error) {
	var e Entry
	err = l.file.View(func(tx *bolt.Tx) error {
		var err error
		e, err = lookupIn(tx, l.path, key, func(err error) error { return l.damagedEntry(key, err) })
		return err
	})
	return e.Applied, e.Hash, e.At, err
}

func (l *Ledger) isClosed() bool { return shutdown.Closed(l.closing) }

// encodeKey is a key as the file stores it: the namespace's length first,
// so ("a","bc") and ("ab","c") never collide.
func encodeKey(k claims.Key) ([]byte, error) {
	if k.ID == "" {
		return nil, errors.New("dedup key is empty")
	}
	n := len(k.Namespace) + len(k.ID)
	if n > MaxKeyBytes {
		return nil, fmt.Errorf("dedup key %.64s... is %d bytes with its namespace; the limit is %d", k.ID, n, MaxKeyBytes)
	}
	out := make([]byte, 0, 2+n)
	out = binary.BigEndian.AppendUint16(out, uint16(len(k.Namespace)))
	out = append(out, k.Namespace...)
	return append(out, k.ID...), nil
}

func encodeValue(key []byte, at time.Time, hash [32]byte) []byte {
	v := make([]byte, 0, valueLen)
	v = append(v, valueVersion)
	v = binary.BigEndian.AppendUint64(v, uint64(at.UnixNano()))
	v = append(v, hash[:]...)
	return binary.BigEndian.AppendUint32(v, boltfile.Checksum(key, v))
}

// decodeValue checks an entry against its key and checksum.
func decodeValue(key, v []byte) (time.Time, [32]byte, error) {
	if len(v) == valueLen && v[0] == valueVersion {
		if got, want := boltfile.Checksum(key, v[:valueLenV1]), binary.BigEndian.Uint32(v[valueLenV1:]); got != want {
			return time.Time{}, [32]byte{}, fmt.Errorf("checksum mismatch (stored %08x, computed %08x)", want, got)
		}
		return decodeBody(v)
	}
	if firstByte(v) > valueVersion {
		return time.Time{}, [32]byte{}, fmt.Errorf("entry of version %d (this build reads 1 to %d): %w: run the release that wrote it, or a newer one", firstByte(v), valueVersion, format.ErrNewer)
	}
	return time.Time{}, [32]byte{}, fmt.Errorf("unreadable entry (%d bytes, version %d)", len(v), firstByte(v))
}

// decodeBody reads a value's time and hash; the caller checked it.
func decodeBody(v []byte) (time.Time, [32]byte, error) {
	var h [32]byte
	copy(h[:], v[9:41])
	return time.Unix(0, int64(binary.BigEndian.Uint64(v[1:9]))), h, nil
}

// damagedEntry is the error for an entry that fails its checksum: the key
// may or may not be applied, so no verdict is given.
func (l *Ledger) damagedEntry(key fmt.Stringer, err error) error {
	return fmt.Errorf("dedup ledger file %s: the entry of key %s is damaged (%v): whether it was applied is unknown, so the message fails; stop the process, move the file aside and restore it from a backup: %w",
		l.path, key, err, boltfile.ErrDamaged)
}

func firstByte(v []byte) int {
	if len(v) == 0 {
		return -1
	}
	return int(v[0])
}

// timeKey is a key of the time index: the applied time (Unix nanoseconds,
// 8 bytes big-endian, so that the index is in time order), then the key.
func timeKey(at time.Time, key []byte) []byte {
	out := make([]byte, 0, 8+len(key))
	out = binary.BigEndian.AppendUint64(out, uint64(at.UnixNano()))
	return append(out, key...)
}

// splitTimeKey undoes timeKey; ok is false for a key too short to hold a
// time (nil: no key).
func splitTimeKey(tk []byte) (at int64, key []byte, ok bool) {
	if len(tk) < 8 {
		return 0, nil, false
	}
	return int64(binary.BigEndian.Uint64(tk[:8])), tk[8:], true
}

// addCount adjusts the stored key count inside tx.
func addCount(tx *bolt.Tx, delta int64) error {
	meta := tx.Bucket(bucketMeta)
	n := int64(boltfile.Uint64(meta, keyCount)) + delta
	if n < 0 {
		n = 0
	}
	return boltfile.PutUint64(meta, keyCount, uint64(n))
}

// put records key as applied at (ledger time) inside tx unless it is
// already there, and stores the clock's reading with it (clock.go). It
// reports what was stored before: existed with its hash (existed with an
// error: the stored entry is damaged, and nothing was written).
func put(tx *bolt.Tx, key []byte, hash [32]byte, at time.Time) (existed bool, old [32]byte, err error) {
	keys := tx.Bucket(bucketKeys)
	if v := keys.Get(key); v != nil {
		_, old, err = decodeValue(key, v)
		return true, old, err
	}
	if err := keys.Put(key, encodeValue(key, at, hash)); err != nil {
		return false, old, err
	}
	if err := tx.Bucket(bucketTime).Put(timeKey(at, key), nil); err != nil {
		return false, old, err
	}
	if err := storeClock(tx, at); err != nil {
		return false, old, err
	}
	return false, old, addCount(tx, 1)
}
