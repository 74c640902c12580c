package boltfile

import (
	"fmt"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/failpoint"
)

// A new file is created the way compaction replaces one (compact.go), so
// that the configured path never names a file without its buckets:
//   - bbolt initialises path+".new" and one fsync'd transaction writes the
//     format marker and the owner's buckets (Options.Create);
//   - the file is fsync'd, renamed to path, and the directory fsync'd.
//
// A power cut before the rename leaves no file at path (the next start
// creates it again and deletes the leftover); after it, the whole file.
// Hence a file at path without buckets is damage (checkMarker).

func newPath(path string) string { return path + ".new" }

func create(path string, init func(*bolt.Tx) error) error {
	tmp := newPath(path)
	if err := os.Remove(tmp); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("creating bbolt file %s: removing the leftover %s: %w", path, tmp, err)
	}
	if err := writeNew(tmp, init); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("creating bbolt file %s: %w", path, err)
	}
	failpoint.Hit(failpoint.CreateWritten)
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("creating bbolt file %s: %w", path, err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("creating bbolt file %s: syncing its directory: %w", path, err)
	}
	return nil
}

// writeNew makes a complete reliable-mqtt file at tmp and fsyncs it.
func writeNew(tmp string, init func(*bolt.Tx) error) error {
	db, err := bolt.Open(tmp, 0o600, writeOptions())
	if err != nil {
		return err
	}
	db.NoSync = noSync
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte(MarkerBucket))
		if err != nil {
			return err
		}
		if err := b.Put([]byte(MarkerKey), []byte(FormatV1)); err != nil {
			return err
		}
		if init != nil {
			return init(tx)
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return syncFile(tmp)
}
