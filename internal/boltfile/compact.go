package boltfile

import (
	"fmt"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/failpoint"
)

// A bbolt file never shrinks: pages freed by deletes are reused, not
// returned. After a large backlog drains, an outbox file keeps its
// high-water size. When this process first opens a file whose free pages
// are at least half of it and at least compactMinFree bytes, it copies the
// live data (every bucket, nested buckets and bucket sequences: bbolt's
// Compact) to path+".compact" and renames the copy over the file.
//
// Crash safety, step by step:
//   - until the rename the original file is untouched; a leftover
//     .compact file is deleted at the next open;
//   - the copy is fsync'd (every bbolt commit, then the file) before the
//     rename, so whichever name the directory holds after a crash names a
//     complete file;
//   - the directory is fsync'd after the rename, so the rename itself
//     survives a power loss.
//
// Compaction needs free disk space for the live data; if it fails the
// original file is used as it is.
var compactMinFree int64 = 16 << 20

// compactTxMaxSize bounds each copy transaction (bbolt.Compact commits in
// chunks of about this many bytes), so memory stays bounded.
const compactTxMaxSize = 16 << 20

func compactPath(path string) string { return path + ".compact" }

// compactIfSparse returns db, or a reopened database of the compacted file
// when the file was sparse enough. compacted reports whether it was
// compacted; err is set only when neither the old nor the new database is
// open any more (the file itself is intact either way). A copy that fails
// (a full disk) leaves the file as it is and is reported in *skipped, for
// the caller to log.
func compactIfSparse(db *bolt.DB, path string, skipped *error) (out *bolt.DB, compacted bool, err error) {
	_ = os.Remove(compactPath(path)) // left by a crash during a compaction
	if !sparse(db) {
		return db, false, nil
	}
	if err := copyCompacted(db, path); err != nil {
		_ = os.Remove(compactPath(path))
		*skipped = err
		return db, false, nil
	}
	failpoint.Hit(failpoint.CompactCopied)
	if err := db.Close(); err != nil {
		_ = os.Remove(compactPath(path))
		return reopen(path, false)
	}
	if err := os.Rename(compactPath(path), path); err != nil {
		_ = os.Remove(compactPath(path))
		return reopen(path, false)
	}
	failpoint.Hit(failpoint.CompactRenamed)
	if err := syncDir(filepath.Dir(path)); err != nil {
		return reopen(path, true)
	}
	failpoint.Hit(failpoint.CompactDone)
	return reopen(path, true)
}

func reopen(path string, compacted bool) (*bolt.DB, bool, error) {
	db, err := bolt.Open(path, 0o600, writeOptions())
	if err != nil {
		return nil, compacted, openError(path, err)
	}
	db.NoSync = noSync
	return db, compacted, nil
}

// sparse reports whether the file's free pages are at least half of it and
// at least compactMinFree bytes.
func sparse(db *bolt.DB) bool {
	st := db.Stats()
	free := int64(st.FreePageN+st.PendingPageN) * int64(db.Info().PageSize)
	var size int64
	if err := db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil }); err != nil {
		return false
	}
	return free >= compactMinFree && free*2 >= size
}

// copyCompacted writes the live data of src to path+".compact" and fsyncs it.
func copyCompacted(src *bolt.DB, path string) error {
	dst, err := bolt.Open(compactPath(path), 0o600, writeOptions())
	if err != nil {
		return err
	}
	dst.NoSync = noSync
	err = guard(path, func() error { return bolt.Compact(dst, src, compactTxMaxSize) })
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("compacting %s: %w", path, err)
	}
	return syncFile(compactPath(path))
}

// syncPath fsyncs a file or a directory.
func syncPath(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
