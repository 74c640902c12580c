package boltfile

import (
	"errors"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// OpenReadOnly opens an existing reliable-mqtt file for a tool that only
// reads it. It takes bbolt's shared lock, waiting at most timeout for a
// process that holds the file (then the error is ErrLocked), and refuses
// what Acquire refuses — a foreign, damaged or truncated file — without
// writing a byte. The caller closes the database.
func OpenReadOnly(path string, timeout time.Duration) (*bolt.DB, error) {
	return openReadOnly(path, timeout, func(*bolt.Tx) error { return nil })
}

// OpenReadOnlyVerified is OpenReadOnly that also verifies the file's
// structure first, as Acquire does with VerifyAlways: every page the file
// references is read and bbolt's consistency check runs. Damage is a
// *DamagedError.
func OpenReadOnlyVerified(path string, timeout time.Duration) (*bolt.DB, error) {
	return openReadOnly(path, timeout, func(tx *bolt.Tx) error { return verify(tx, path) })
}

func openReadOnly(path string, timeout time.Duration, more func(*bolt.Tx) error) (*bolt.DB, error) {
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
		return nil, emptyFile(path)
	}
	if _, _, err := checkMetas(path, st.Size()); err != nil {
		return nil, err
	}
	return openChecked(path, st.Size(), timeout, more)
}

// Guard runs fn, which reads a database opened with OpenReadOnly, and
// turns a bbolt panic or memory fault on a damaged page into a
// *DamagedError naming the file.
func Guard(path string, fn func() error) error { return guard(path, fn) }
