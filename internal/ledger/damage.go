package ledger

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
)

// upgradeBatch bounds the entries rewritten per upgrade transaction.
const upgradeBatch = 10000

// upgradeEntries rewrites version-1 entries (written before checksums) with
// a checksum, upgradeBatch per transaction, then marks the file as
// checksummed. An entry that is not a readable version-1 entry either stops
// the upgrade: it is damage, and a ledger never forgets a key silently.
func (l *Ledger) upgradeEntries() error {
	err := l.file.UpgradeEntries(layout, upgradeBatch, func(tx *bolt.Tx, k, v []byte) error {
		if len(v) == valueLen && v[0] == valueVersion {
			return nil
		}
		if err := newerEntry(l.path, k, v); err != nil {
			return err
		}
		if len(v) != valueLenV1 || v[0] != valueVersionV1 {
			return &boltfile.DamagedError{Path: l.path, Cause: fmt.Sprintf("dedup ledger entry %x is unreadable (%d bytes, version %d) while adding checksums", k, len(v), firstByte(v))}
		}
		at, hash, _ := decodeBody(v)
		return tx.Bucket(bucketKeys).Put(k, encodeValue(k, at, hash))
	})
	if format.IsNewer(err) {
		return err
	}
	if err != nil {
		return fmt.Errorf("dedup ledger file %s: adding checksums to the entries written by an earlier version failed: %w", l.path, err)
	}
	return nil
}

// verifyEntries checks every entry's checksum and that the entries in the
// file are as many as the stored count: a damaged page can drop keys
// without any read failing (a leaf's element count lowered), and a ledger
// that forgot a key applies its event again.
func (l *Ledger) verifyEntries() error {
	return l.file.View(func(tx *bolt.Tx) error {
		_, err := check(tx, l.path)
		return err
	})
}

// check reads every entry in tx: each must pass its checksum, and there
// must be at least as many as the counter says. It returns the count.
func check(tx *bolt.Tx, path string) (uint64, error) {
	if err := format.Check(path, "the dedup ledger", boltfile.Uint64(tx.Bucket(bucketMeta), boltfile.KeyFormat), valueVersion); err != nil {
		return 0, err
	}
	var n, bad uint64
	var first string
	err := tx.Bucket(bucketKeys).ForEach(func(k, v []byte) error {
		n++
		if _, _, err := decodeValue(k, v); err != nil {
			if format.IsNewer(err) {
				return newerEntry(path, k, v) // not damage: refused whole
			}
			if bad == 0 {
				first = fmt.Sprintf("entry %x: %v", k, err)
			}
			bad++
		}
		return nil
	})
	if err != nil {
		return n, err
	}
	if bad > 0 {
		return n, &boltfile.DamagedError{Path: path, Cause: fmt.Sprintf("%d dedup ledger entries fail their checksum, the first %s", bad, first)}
	}
	if want := boltfile.Uint64(tx.Bucket(bucketMeta), keyCount); n < want {
		return n, &boltfile.DamagedError{Path: path, Cause: fmt.Sprintf("its counter says %d dedup ledger keys are applied but %d are in the file: keys were lost to damage, and their events would be applied again", want, n)}
	}
	return n, nil
}
