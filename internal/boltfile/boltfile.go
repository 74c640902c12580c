// Package boltfile shares bbolt database files inside one process.
//
// bbolt takes an exclusive flock on its file, so a second bbolt.Open of the
// same file in the same process blocks forever. Every component that keeps
// state in a bbolt file (the outbox, the dedup ledger) therefore opens it
// through Acquire, which hands out reference-counted handles to one shared
// *bbolt.DB per file. Two components naming the same file share one
// database, so they can commit their state in one transaction.
//
// Every file carries a format marker (bucket "reliable-mqtt", key "format",
// value "reliable-mqtt/1"). A file that is not ours — another program's bolt
// database, or not a bolt database at all — is refused, and is never
// written, truncated or repaired.
package boltfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
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

// File is one handle to a shared database. Each Acquire returns a new handle;
// each handle must be released exactly once.
type File struct {
	shared *sharedDB

	mu       sync.Mutex
	released bool
}

type sharedDB struct {
	path string
	db   *bolt.DB
	refs int // guarded by registryMu
}

var (
	registryMu sync.Mutex
	registry   = map[string]*sharedDB{}
)

// Acquire opens the bbolt file at path, or joins it if this process already
// has it open. The parent directory must exist. The file is created if it is
// missing or empty, and refused if it is not a reliable-mqtt database.
func Acquire(path string) (*File, error) {
	key, err := identity(path)
	if err != nil {
		return nil, err
	}

	// The registry lock is held while opening so that two components racing
	// for the same new file cannot both call bbolt.Open on it.
	registryMu.Lock()
	defer registryMu.Unlock()

	if s, ok := registry[key]; ok {
		s.refs++
		return &File{shared: s}, nil
	}
	db, err := open(key)
	if err != nil {
		return nil, err
	}
	s := &sharedDB{path: key, db: db, refs: 1}
	registry[key] = s
	return &File{shared: s}, nil
}

// DB returns the shared database. It must not be closed by the caller.
func (f *File) DB() *bolt.DB { return f.shared.db }

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

	registryMu.Lock()
	defer registryMu.Unlock()
	s := f.shared
	s.refs--
	if s.refs > 0 {
		return nil
	}
	delete(registry, s.path)
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("closing bbolt file %s: %w", s.path, err)
	}
	return nil
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

// open opens path read-write after checking, without writing, that an
// existing file is ours.
func open(path string) (*bolt.DB, error) {
	st, err := os.Stat(path)
	exists := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("bbolt file %s: %w", path, err)
	}
	// A non-empty file is inspected read-only first: bbolt writes to a file
	// it opens read-write (freelist sync), and a refused file must stay
	// byte-for-byte unchanged.
	if exists && st.Size() > 0 {
		if err := inspect(path, st.Size()); err != nil {
			return nil, err
		}
	}

	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		return nil, openError(path, err)
	}
	if err := ensureMarker(db, path); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// inspect opens an existing file read-only and checks it is an intact
// reliable-mqtt database.
func inspect(path string, size int64) error {
	db, err := openChecked(path, size, lockTimeout)
	if err != nil {
		return err
	}
	return db.Close()
}

// checkFirstPage refuses a file whose first meta page names a page size
// larger than the file can hold two meta pages of; bbolt would read the
// second meta page beyond the end of the file.
func checkFirstPage(path string, size int64) error {
	const (
		magic       = 0xED0CDAED
		metaOffset  = 16 // bbolt page header
		pageSizeOff = metaOffset + 8
	)
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("bbolt file %s: %w", path, err)
	}
	defer f.Close()
	var head [pageSizeOff + 4]byte
	if _, err := io.ReadFull(f, head[:]); err != nil {
		// Too short to be a database; bbolt gives the reason.
		return nil
	}
	if binary.NativeEndian.Uint32(head[metaOffset:]) != magic {
		return nil
	}
	pageSize := int64(binary.NativeEndian.Uint32(head[pageSizeOff:]))
	if size < 2*pageSize {
		return fmt.Errorf("bbolt file %s is truncated: it is %d bytes, less than its two %d-byte meta pages; refusing to touch it: restore it from a backup or move it away", path, size, pageSize)
	}
	return nil
}

// ensureMarker writes the format marker into a new, empty database and
// checks it on any other.
func ensureMarker(db *bolt.DB, path string) error {
	// Look before writing: a file that already has its marker is not
	// written at open (it may sit on a full disk).
	hasMarker := false
	if err := db.View(func(tx *bolt.Tx) error {
		hasMarker = tx.Bucket([]byte(MarkerBucket)) != nil
		return checkMarker(tx, path)
	}); err != nil {
		return err
	}
	if hasMarker {
		return nil
	}
	return db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte(MarkerBucket)) == nil && len(bucketNames(tx)) == 0 {
			b, err := tx.CreateBucket([]byte(MarkerBucket))
			if err != nil {
				return fmt.Errorf("bbolt file %s: writing format marker: %w", path, err)
			}
			return b.Put([]byte(MarkerKey), []byte(FormatV1))
		}
		// Returning an error rolls back: nothing is written to a refused file.
		return checkMarker(tx, path)
	})
}

// checkMarker accepts only a database whose marker says FormatV1.
func checkMarker(tx *bolt.Tx, path string) error {
	b := tx.Bucket([]byte(MarkerBucket))
	if b == nil {
		names := bucketNames(tx)
		if len(names) == 0 {
			return nil // empty database: the read-write open adds the marker
		}
		return fmt.Errorf("bbolt file %s: %w: it has buckets [%s] and no format marker; refusing to touch it", path, ErrNotOurs, strings.Join(names, " "))
	}
	v := b.Get([]byte(MarkerKey))
	if v == nil {
		return fmt.Errorf("bbolt file %s: %w: bucket %q has no %q key; refusing to touch it", path, ErrNotOurs, MarkerBucket, MarkerKey)
	}
	if string(v) != FormatV1 {
		shown := string(v)
		if len(shown) > 64 {
			shown = shown[:64] + "..."
		}
		return fmt.Errorf("bbolt file %s: %w: format marker is %q, this build understands %q; refusing to touch it", path, ErrNotOurs, shown, FormatV1)
	}
	return nil
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
