package boltfile

import (
	"errors"
	"fmt"
	"hash/crc32"
	"syscall"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
)

// A Section is the set of buckets one store keeps in a shared file (the
// outbox's, the dedup ledger's), each entry of its data bucket checksummed.
//
// Invariant, enforced by OpenSection: a section's buckets are created
// together in one transaction, so a file holding some of them but not all
// is damage, never a section to start afresh; and a section is used only
// once every entry carries a checksum (KeyChecksums in its meta bucket):
// a section without the marker is upgraded first, a new one gets it at
// creation.
//
// Invariant: a section names the format version that wrote it (KeyFormat
// in its meta bucket), and one newer than Format is refused whole before
// anything reads or writes it (a *format.NewerError). A section written
// before the marker existed is read as Format and gets the marker.
type Section struct {
	// Name names the store in errors ("outbox", "dedup ledger").
	Name string
	// Format is the version of the section's layout this build writes
	// and the newest it reads; 0: the section keeps no KeyFormat.
	Format uint64
	// Buckets are created together. The first holds the checksummed
	// entries; the last is the meta bucket, which holds KeyChecksums.
	Buckets [][]byte
	// Init adds, in the creating transaction, what is created with the
	// buckets (the outbox's client ID); nil: nothing.
	Init func(meta *bolt.Bucket) error
	// Complete reports whether what Init writes is there; nil: the
	// buckets suffice.
	Complete func(meta *bolt.Bucket) bool
	// Check runs in the read transaction that found the section complete:
	// cheap consistency checks that need no walk. nil: none.
	Check func(tx *bolt.Tx) error
	// Upgrade rewrites the entries written before checksums and stores
	// KeyChecksums (UpgradeEntries); it runs when the marker is missing.
	Upgrade func() error
	// Verify reads every entry; it runs when the file's structure was
	// verified at open (Verified). nil: nothing more to check.
	Verify func() error
}

// KeyChecksums, present in a section's meta bucket, marks that every entry
// carries a checksum.
var KeyChecksums = []byte("checksums")

// UpgradeEntries is the body of a section's Upgrade: rewrite runs for every
// entry of s's data bucket, n per transaction (UpdateInBatches), and the
// transaction of the last batch stores KeyChecksums.
func (f *File) UpgradeEntries(s Section, n int, rewrite func(tx *bolt.Tx, k, v []byte) error) error {
	return f.UpdateInBatches(s.Buckets[0], n, rewrite, func(tx *bolt.Tx) error {
		return s.meta(tx).Put(KeyChecksums, []byte{1})
	})
}

// KeyFormat in a section's meta bucket holds the section's format version
// (8 bytes, big-endian).
var KeyFormat = []byte("format")

// checkFormat refuses a section whose stored format is newer than s.Format,
// and reports whether its marker is missing or older (to be rewritten).
func (s Section) checkFormat(meta *bolt.Bucket, path string) (stale bool, err error) {
	if s.Format == 0 {
		return false, nil
	}
	v := meta.Get(KeyFormat)
	if v == nil {
		return true, nil
	}
	found := Uint64(meta, KeyFormat)
	if len(v) != 8 {
		return false, &DamagedError{Path: path, Cause: fmt.Sprintf("the %s's format marker is %d bytes, not 8", s.Name, len(v))}
	}
	if err := format.Check(path, "the "+s.Name, found, s.Format); err != nil {
		return false, err
	}
	return found < s.Format, nil
}

// Checksum is the CRC-32C of key followed by body: an entry's checksum
// covers its key, so a value that a damaged page shows under another key
// fails too.
func Checksum(key, body []byte) uint32 {
	return crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, body)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (s Section) meta(tx *bolt.Tx) *bolt.Bucket { return tx.Bucket(s.Buckets[len(s.Buckets)-1]) }

// CreateIn makes the section's buckets in tx, runs Init, and marks a
// section without entries as checksummed. It reports whether the section
// is checksummed. Use it as Options.Create, so a new file is born with the
// section.
func (s Section) CreateIn(tx *bolt.Tx) (checksummed bool, err error) {
	for _, name := range s.Buckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return false, err
		}
	}
	meta := s.meta(tx)
	if s.Format != 0 && meta.Get(KeyFormat) == nil {
		if err := PutUint64(meta, KeyFormat, s.Format); err != nil {
			return false, err
		}
	}
	if s.Init != nil {
		if err := s.Init(meta); err != nil {
			return false, err
		}
	}
	if tx.Bucket(s.Buckets[0]).Stats().KeyN == 0 {
		return true, meta.Put(KeyChecksums, []byte{1})
	}
	return meta.Get(KeyChecksums) != nil, nil
}

// OpenSection readies s in f: it creates the section in a file that has
// none of it (a section added to another store's file), refuses a file
// that holds only part of it, upgrades entries written before checksums,
// and verifies every entry when the file was verified.
func (f *File) OpenSection(s Section) error {
	path := f.Path()
	ready, checksummed, some, stale := false, false, false, false
	err := f.View(func(tx *bolt.Tx) error {
		all := true
		for _, name := range s.Buckets {
			if tx.Bucket(name) != nil {
				some = true
			} else {
				all = false
			}
		}
		if !all || (s.Complete != nil && !s.Complete(s.meta(tx))) {
			return nil
		}
		var err error
		if stale, err = s.checkFormat(s.meta(tx), path); err != nil {
			return err
		}
		if s.Check != nil {
			if err := s.Check(tx); err != nil {
				return err
			}
		}
		ready, checksummed = true, s.meta(tx).Get(KeyChecksums) != nil
		return nil
	})
	if err != nil {
		return fmt.Errorf("opening %s file %s: %w", s.Name, path, err)
	}
	if !ready && some {
		return fmt.Errorf("opening %s file %s: %w", s.Name, path, &DamagedError{Path: path, Cause: fmt.Sprintf("it holds only part of the %s (buckets %q are created together): the rest was lost to damage", s.Name, s.Buckets)})
	}
	if !ready {
		err := f.Update(func(tx *bolt.Tx) (err error) {
			checksummed, err = s.CreateIn(tx)
			return err
		})
		if err != nil {
			return fmt.Errorf("creating the %s buckets in %s: %w", s.Name, path, err)
		}
	}
	if !checksummed {
		if err := s.Upgrade(); err != nil {
			return err
		}
	}
	if stale {
		if err := f.markFormat(s); err != nil {
			return err
		}
	}
	if f.Verified() && s.Verify != nil {
		return s.Verify()
	}
	return nil
}

// markFormat stores s.Format in a section written before its marker. On a
// full disk it is left for a later start: an existing section must open
// (and drain) without room to write, and reads as s.Format without it.
func (f *File) markFormat(s Section) error {
	err := f.Update(func(tx *bolt.Tx) error { return PutUint64(s.meta(tx), KeyFormat, s.Format) })
	if err != nil && !errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("%s file %s: storing its format marker: %w", s.Name, f.Path(), err)
	}
	return nil
}
