// Package boltfile shares bbolt database files inside one process.
//
// bbolt takes an exclusive flock on its file, so a second bbolt.Open of the
// same file in the same process blocks forever. Every component that keeps
// state in a bbolt file (the outbox, the dedup ledger) therefore opens it
// through AcquireWith, which hands out reference-counted handles to one shared
// *bbolt.DB per file. Two components naming the same file share one
// database, so they can commit their state in one transaction.
//
// Every file carries a format marker (bucket "reliable-mqtt", key "format",
// value "reliable-mqtt/1"), and each store in it the format version of its
// own buckets (Section.Format). A file that is not ours — another program's
// bolt database, or not a bolt database at all — is refused, and is never
// written, truncated or repaired; so is one whose marker names a newer
// version ("reliable-mqtt/2"), with a *format.NewerError.
//
// Invariant: a file at a configured path always holds its owner's buckets.
// A new file is written whole under a temporary name (create.go) and only
// then renamed into place, so a file there that is empty, or holds no bucket
// besides the marker, is not new: its data is gone. It is refused as
// damaged, never taken for a fresh file.
//
// Damage is looked for at open, before bbolt writes anything: both meta
// pages are read (a damaged newest one means bbolt silently opens the
// previous commit), and with Options.Verify every page the file references
// is read and bbolt's consistency check runs. Reads and writes go through
// File.View and File.Update, which turn a bbolt panic on a damaged page into
// a refusal instead of a crash.
package boltfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
	reg "github.com/reliable-mqtt/reliable-mqtt/internal/registry"
)

// Marker bucket, key and value that identify a reliable-mqtt file.
const (
	MarkerBucket = "reliable-mqtt"
	MarkerKey    = "format"
	FormatV1     = "reliable-mqtt/1"
)

// lockTimeout bounds the wait for a file lock held by another process.
// A variable so tests can shorten it.
var lockTimeout = 2 * time.Second

// ErrLocked reports that another process holds the file's lock.
var ErrLocked = errors.New("locked by another process")

// ErrNotOurs reports a file that is not a reliable-mqtt database.
var ErrNotOurs = errors.New("not a reliable-mqtt file")

// File is one handle to a shared database. Each AcquireWith returns a new handle;
// each handle must be released exactly once.
type File struct {
	shared *sharedDB

	mu       sync.Mutex
	released bool
}

type sharedDB struct {
	path       string
	db         *bolt.DB
	meta       *MetaDamage // found at open; nil if both meta pages check out
	verified   bool        // the structure was verified at open
	compacted  bool        // the file was compacted at open (compact.go)
	compactErr error       // why a compaction due at open was skipped; nil if none

	damaged atomic.Pointer[DamagedError] // set by the first recovered bbolt panic
}

// Options say how AcquireWith checks a file. They apply when this process opens
// the file; a later AcquireWith of the same file joins the open database (and
// is still refused by a meta-page rollback it does not accept).
type Options struct {
	// Verify: when to read every page and run bbolt's consistency check at
	// open. The zero value is VerifyAuto.
	Verify Verify
	// AcceptRollback opens a file whose newest meta page is damaged (or may
	// be), i.e. a file that may have silently lost its last commit. Without
	// it AcquireWith refuses such a file. MetaDamage reports what was found.
	AcceptRollback bool
	// Create initialises a new file's buckets, in the transaction that
	// writes the format marker, before the file appears at its path. It
	// runs only when no file exists at the path.
	Create func(tx *bolt.Tx) error
}

// registry holds the process's open files by absolute path.
var registry reg.Registry[*sharedDB]

// AcquireWith opens the bbolt file at path, or joins it if this process
// already has it open, with checks chosen by opts. The parent directory
// must exist. The file is created if it is missing, and refused if it is
// not a reliable-mqtt database or holds none of its data (an empty file, or
// one with no buckets besides the marker).
func AcquireWith(path string, opts Options) (*File, error) {
	key, err := identity(path)
	if err != nil {
		return nil, err
	}

	// The registry opens under its lock, so that two components racing for
	// the same new file cannot both call bbolt.Open on it.
	join := func(s *sharedDB) error {
		if err := refuseRollback(s.meta, opts); err != nil {
			return err
		}
		if err := s.damaged.Load(); err != nil {
			return err
		}
		return nil
	}
	s, err := registry.Acquire(key, join, func() (*sharedDB, error) { return open(key, opts) })
	if err != nil {
		return nil, err
	}
	return &File{shared: s}, nil
}

func refuseRollback(m *MetaDamage, opts Options) error {
	if m == nil || !m.RolledBack() || opts.AcceptRollback {
		return nil
	}
	return fmt.Errorf("%s; refusing to open it: a rolled-back file has forgotten what its last commit wrote. Restore the file from a backup, or, if losing that commit is acceptable, set accept_rollback: true for one start (the next commit rewrites the damaged page)", m)
}

// DB returns the shared database. It must not be closed by the caller.
// Prefer View and Update, which recover from bbolt panics on damaged pages.
func (f *File) DB() *bolt.DB { return f.shared.db }

// MetaDamage reports a damaged meta page found at open, or nil.
func (f *File) MetaDamage() *MetaDamage { return f.shared.meta }

// Verified reports whether the file's structure was verified at open, so
// its owner can afford a full scan of its own values too.
func (f *File) Verified() bool { return f.shared.verified }

// Compacted reports whether this process compacted the file when it opened it.
func (f *File) Compacted() bool { return f.shared.compacted }

// CompactionSkipped returns why a compaction due at open failed (the file
// is used as it was), or nil.
func (f *File) CompactionSkipped() error { return f.shared.compactErr }

// Path returns the file's absolute path, which is its identity in this process.
func (f *File) Path() string { return f.shared.path }

// Release gives up this handle. The last release closes the database.
func (f *File) Release() error {
	f.mu.Lock()
	if f.released {
		f.mu.Unlock()
		return fmt.Errorf("bbolt file %s: handle released twice", f.shared.path)
	}
	f.released = true
	f.mu.Unlock()

	// Closed under the registry's lock: the next AcquireWith of the file must
	// not open it while this process still holds its file lock.
	return registry.ReleaseClose(f.shared.path, f.shared, func(s *sharedDB) error {
		s.syncFreelist()
		if err := s.db.Close(); err != nil {
			return fmt.Errorf("closing bbolt file %s: %w", s.path, err)
		}
		return nil
	})
}

// identity returns the cleaned absolute path with symlinks resolved, so two
// spellings of one file share one database.
func identity(path string) (string, error) {
	if path == "" {
		return "", errors.New("bbolt file path is empty")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("bbolt file %s: resolving absolute path: %w", path, err)
	}
	dir, base := filepath.Split(abs)
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("bbolt file %s: directory %s does not exist; create it first", abs, dir)
		}
		return "", fmt.Errorf("bbolt file %s: resolving directory %s: %w", abs, dir, err)
	}
	if st, err := os.Stat(realDir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("bbolt file %s: %s is not a directory", abs, dir)
	}
	key := filepath.Join(realDir, base)
	// If the file itself is a symlink, follow it too.
	if real, err := filepath.EvalSymlinks(key); err == nil {
		key = real
	}
	if st, err := os.Stat(key); err == nil && st.IsDir() {
		return "", fmt.Errorf("bbolt file %s is a directory", key)
	}
	return key, nil
}

// open opens path read-write after checking, without writing, that the
// file is ours and intact; a missing file is created first (create.go).
func open(path string, opts Options) (*sharedDB, error) {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		if err = create(path, opts.Create); err == nil {
			st, err = os.Stat(path)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bbolt file %s: %w", path, err)
	}
	s := &sharedDB{path: path}
	// The file is inspected read-only first: bbolt writes to a file it
	// opens read-write (freelist sync), and a refused file must stay
	// byte-for-byte unchanged.
	if err := inspect(s, st.Size(), opts); err != nil {
		return nil, err
	}
	err = guard(path, func() error {
		db, err := bolt.Open(path, 0o600, writeOptions())
		if err != nil {
			return openError(path, err)
		}
		db.NoSync = noSync
		s.db = db
		return nil
	})
	if err != nil {
		return nil, err
	}
	if s.meta == nil { // a damaged file is kept as it is, for inspection
		if s.db, s.compacted, err = compactIfSparse(s.db, path, &s.compactErr); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// syncFreelist writes the freelist once, in a last commit, so that the
// next open reads it instead of walking the whole tree (about a second for
// a 1M-record outbox; docs/operations.md). Only after a crash or a power
// cut does the next open walk. Nothing else writes now (the last handle
// is being released); a failure only means the next open walks.
func (s *sharedDB) syncFreelist() {
	if s.damaged.Load() != nil || s.meta != nil {
		return // a damaged file is kept as it is, for inspection
	}
	if st := s.db.Stats(); st.TxStats.GetWrite() == 0 {
		return // not written since it was opened (or refused): left untouched
	}
	s.db.NoFreelistSync = false
	_ = guard(s.path, func() error { return s.db.Update(func(*bolt.Tx) error { return nil }) })
}

// writeOptions are bbolt's options for a file opened read-write.
//
// NoFreelistSync: bbolt otherwise writes the whole freelist to a new page
// at every commit, one more page per fsync (a third of what a small commit
// writes; docs/operations.md, "Flash wear"). The last release writes it
// once (syncFreelist); after a crash bbolt rebuilds it at open by walking
// every page the tree references (docs/operations.md says how long that
// takes on a large file). bbolt's meta pages say whether a freelist was
// written, so a file written either way opens with either setting.
func writeOptions() *bolt.Options {
	return &bolt.Options{Timeout: lockTimeout, NoFreelistSync: true}
}

// inspect opens an existing file read-only and checks it is an intact
// reliable-mqtt database: both meta pages, the high-water mark, the marker
// and, if opts ask for it, every page.
func inspect(s *sharedDB, size int64, opts Options) error {
	if size == 0 {
		return emptyFile(s.path)
	}
	m0, m1, err := checkMetas(s.path, size)
	if err != nil {
		return err
	}
	s.meta = metaDamage(s.path, m0, m1)
	if err := refuseRollback(s.meta, opts); err != nil {
		return err
	}
	db, err := openChecked(s.path, size, lockTimeout, func(tx *bolt.Tx) error {
		if !opts.Verify.wants(size) {
			if syncedFreelist(m0, m1) {
				return nil
			}
			// bbolt rebuilds the freelist at a read-write open by
			// walking the whole tree on a goroutine of its own, where a
			// damaged page crashes the process: walk it safely first.
			return walkTree(tx, s.path)
		}
		s.verified = true
		return verify(tx, s.path)
	})
	if err != nil {
		return err
	}
	return db.Close()
}

// checkMetas reads both meta pages from the file itself, before bbolt
// trusts either: a file none of whose meta pages is bbolt's is foreign, and
// one shorter than the two meta pages it implies is truncated.
func checkMetas(path string, size int64) (m0, m1 metaPage, err error) {
	m0, m1, ok, err := readMetas(path, size)
	if err != nil {
		return m0, m1, err
	}
	if !ok {
		// No meta page carries bbolt's magic number: another program's
		// file, whatever its size.
		return m0, m1, openError(path, berrors.ErrInvalid)
	}
	pageSize := m1.pageSize
	if m0.valid {
		pageSize = m0.pageSize
	}
	return m0, m1, checkSize(path, size, pageSize)
}

// openChecked opens path read-only (waiting at most timeout for another
// process's lock) and checks, in one read transaction, the high-water mark,
// the format marker and then whatever more is asked of the tree. A bbolt
// panic on a damaged page becomes a *DamagedError. The caller closes the
// database.
func openChecked(path string, size int64, timeout time.Duration, more func(tx *bolt.Tx) error) (db *bolt.DB, err error) {
	err = guard(path, func() error {
		if db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout, ReadOnly: true}); err != nil {
			return openError(path, err)
		}
		return db.View(func(tx *bolt.Tx) error {
			// Every page the database references lies below its high-water
			// mark; a file shorter than that was truncated.
			if tx.Size() > size {
				return fmt.Errorf("bbolt file %s is truncated: it is %d bytes but its metadata needs %d; refusing to touch it: restore it from a backup or move it away", path, size, tx.Size())
			}
			if err := checkMarker(tx, path); err != nil {
				return err
			}
			return more(tx)
		})
	})
	if err != nil {
		if db != nil {
			_ = db.Close()
		}
		return nil, err
	}
	return db, nil
}

// checkSize refuses a file too short for the two meta pages its first meta
// page implies; bbolt would read the second one beyond the end of the file.
func checkSize(path string, size, pageSize int64) error {
	if size < 2*pageSize {
		return fmt.Errorf("bbolt file %s is truncated: it is %d bytes, less than its two %d-byte meta pages; refusing to touch it: restore it from a backup or move it away", path, size, pageSize)
	}
	return nil
}

// checkMarker accepts only a database whose marker says FormatV1 and that
// holds at least one bucket besides it.
func checkMarker(tx *bolt.Tx, path string) error {
	b := tx.Bucket([]byte(MarkerBucket))
	names := bucketNames(tx)
	if b == nil {
		if len(names) == 0 {
			// bbolt initialised the file and nothing was ever committed
			// to it: not a file reliable-mqtt created (create.go).
			return &DamagedError{Path: path, Cause: "it holds no buckets at all: bbolt initialised it, but reliable-mqtt's data is not in it (reliable-mqtt creates a file whole, with its buckets, so whatever was here is lost)"}
		}
		return fmt.Errorf("bbolt file %s: %w: it has buckets [%s] and no format marker; refusing to touch it", path, ErrNotOurs, strings.Join(names, " "))
	}
	v := b.Get([]byte(MarkerKey))
	if v == nil {
		return fmt.Errorf("bbolt file %s: %w: bucket %q has no %q key; refusing to touch it", path, ErrNotOurs, MarkerBucket, MarkerKey)
	}
	if n, ok := markerVersion(v); ok && n > fileFormat {
		return format.Check(path, "bbolt file format marker "+strconv.Quote(string(v)), n, fileFormat)
	}
	if string(v) != FormatV1 {
		shown := string(v)
		if len(shown) > 64 {
			shown = shown[:64] + "..."
		}
		return fmt.Errorf("bbolt file %s: %w: format marker is %q, this build understands %q; refusing to touch it", path, ErrNotOurs, shown, FormatV1)
	}
	if len(names) == 1 {
		return &DamagedError{Path: path, Cause: "it holds the format marker and no outbox or ledger buckets (reliable-mqtt creates a file whole, with its buckets, so they are lost)"}
	}
	return nil
}

// fileFormat is the version FormatV1 names; the only one this build reads.
const fileFormat = 1

// markerVersion reads N from a marker "reliable-mqtt/N".
func markerVersion(v []byte) (uint64, bool) {
	rest, ok := strings.CutPrefix(string(v), "reliable-mqtt/")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 10, 64)
	return n, err == nil
}

// emptyFile refuses a 0-byte file at a configured path: reliable-mqtt never
// leaves one there (create.go), so its content was lost.
func emptyFile(path string) error {
	return &DamagedError{Path: path, Cause: "it is empty (0 bytes): reliable-mqtt creates a file whole, with its buckets, so whatever was here is lost; if nothing was, delete the file"}
}

// bucketNames lists up to 20 top-level bucket names, in key order.
func bucketNames(tx *bolt.Tx) []string {
	const limit = 20
	var names []string
	errStop := errors.New("stop")
	_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		if len(names) == limit {
			names = append(names, "...")
			return errStop
		}
		names = append(names, string(name))
		return nil
	})
	return names
}

func openError(path string, err error) error {
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("bbolt file %s is %w; only one process may own it (stop the other process or choose another path)", path, ErrLocked)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch):
		return fmt.Errorf("bbolt file %s is not a usable bbolt database (bbolt: %w); refusing to touch it: move it away or choose another path", path, err)
	default:
		return fmt.Errorf("opening bbolt file %s: %w", path, err)
	}
}

// Uint64 reads a counter stored by PutUint64; a missing or malformed value
// reads as 0.
func Uint64(b *bolt.Bucket, key []byte) uint64 {
	v := b.Get(key)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// PutUint64 stores n under key as 8 big-endian bytes.
func PutUint64(b *bolt.Bucket, key []byte, n uint64) error {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], n)
	return b.Put(key, v[:])
}

// Bounds of one UpdateInBatches transaction.
const batchMaxBytes = 16 << 20

// UpdateInBatches calls fn for every key of bucket in key order, in write
// transactions of at most n keys (and about 16 MiB of values), then last in
// the transaction that saw the last key, so a pass over a large bucket
// neither holds the writer long nor builds one huge transaction. fn gets
// copies and may write to the bucket: the cursor has moved on by then.
func (f *File) UpdateInBatches(bucket []byte, n int, fn func(tx *bolt.Tx, k, v []byte) error, last func(tx *bolt.Tx) error) error {
	var after []byte
	for {
		done := false
		err := f.Update(func(tx *bolt.Tx) error {
			type kv struct{ k, v []byte }
			var batch []kv
			size := 0
			c := tx.Bucket(bucket).Cursor()
			k, v := c.First()
			if after != nil {
				if k, v = c.Seek(after); k != nil && bytes.Equal(k, after) {
					k, v = c.Next()
				}
			}
			for ; k != nil && len(batch) < n && size < batchMaxBytes; k, v = c.Next() {
				batch = append(batch, kv{bytes.Clone(k), bytes.Clone(v)})
				size += len(v)
			}
			for _, e := range batch {
				if err := fn(tx, e.k, e.v); err != nil {
					return err
				}
			}
			if len(batch) > 0 {
				after = batch[len(batch)-1].k
			}
			if k != nil {
				return nil
			}
			done = true
			return last(tx)
		})
		if err != nil || done {
			return err
		}
	}
}

// WrittenBytes is what bbolt has written to the file since this process
// opened it: page writes times the page size, meta pages included (a run
// of overflow pages counts as one page, so records larger than a page are
// undercounted). It is a measure of flash wear; the filesystem's journal
// comes on top (docs/operations.md, "Flash wear").
func (f *File) WrittenBytes() int64 {
	db := f.shared.db
	st := db.Stats()
	// Info reads the memory map, which a commit may be replacing: only
	// inside a transaction does it stay put. (A closed file reads as 0.)
	var page int
	_ = db.View(func(tx *bolt.Tx) error { page = tx.DB().Info().PageSize; return nil })
	return st.TxStats.GetWrite() * int64(page)
}
