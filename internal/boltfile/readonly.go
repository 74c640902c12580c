package boltfile

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
)

// OpenReadOnly opens an existing reliable-mqtt file for a tool that only
// reads it. It takes bbolt's shared lock, waiting at most timeout for a
// process that holds the file (then the error is ErrLocked), and refuses
// what Acquire refuses — a foreign, damaged or truncated file — without
// writing a byte. The caller closes the database.
func OpenReadOnly(path string, timeout time.Duration) (*bolt.DB, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("bbolt file %s does not exist", path)
		}
		return nil, fmt.Errorf("bbolt file %s: %w", path, err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("bbolt file %s is a directory", path)
	}
	if st.Size() == 0 {
		return nil, fmt.Errorf("bbolt file %s is empty: no process has written to it yet", path)
	}
	return openChecked(path, st.Size(), timeout)
}

// openChecked opens path read-only and checks that it is an intact
// reliable-mqtt database.
func openChecked(path string, size int64, timeout time.Duration) (db *bolt.DB, err error) {
	if err := checkFirstPage(path, size); err != nil {
		return nil, err
	}
	// A damaged file can make bbolt read past the end of its memory map;
	// turn that fault into an error instead of a crash.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				_ = db.Close()
			}
			db, err = nil, Damaged(path, r)
		}
	}()

	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout, ReadOnly: true})
	if err != nil {
		return nil, openError(path, err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		// Every page the database references lies below its high-water
		// mark; a file shorter than that was truncated.
		if tx.Size() > size {
			return fmt.Errorf("bbolt file %s is truncated: it is %d bytes but its metadata needs %d; refusing to touch it: restore it from a backup or move it away", path, size, tx.Size())
		}
		return checkMarker(tx, path)
	})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// Damaged words the refusal of a file whose reading faulted (r is what
// was recovered).
func Damaged(path string, r any) error {
	return fmt.Errorf("bbolt file %s is damaged (%v); refusing to touch it: restore it from a backup or move it away", path, r)
}
