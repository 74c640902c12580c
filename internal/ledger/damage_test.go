package ledger

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
)

func commitKeys(t *testing.T, l *Ledger, ids ...string) {
	t.Helper()
	for _, id := range ids {
		c, v := claimT(t, l, claims.Key{ID: id}, "p-"+id)
		if v != claims.Pass {
			t.Fatalf("%s: %v", id, v)
		}
		if err := c.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// flipEntry flips one bit of a stored entry behind the ledger's back.
func flipEntry(t *testing.T, l *Ledger, id string, at int) {
	t.Helper()
	k, _ := encodeKey(claims.Key{ID: id})
	if err := l.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketKeys)
		v := append([]byte(nil), b.Get(k)...)
		v[at] ^= 0x01
		return b.Put(k, v)
	}); err != nil {
		t.Fatal(err)
	}
}

func TestDamagedEntryIsNeverReadAsNotApplied(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.db")
	l := openT(t, path, Options{})
	commitKeys(t, l, "a", "b")
	flipEntry(t, l, "a", 20) // inside the hash: still 45 bytes, version 2

	_, _, err := l.Claim(context.Background(), claims.Key{ID: "a"}, hashOf("p-a"), time.Second)
	if !errors.Is(err, boltfile.ErrDamaged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `"a"`) {
		t.Fatalf("Claim of a damaged key: %v, want a damaged-entry error", err)
	}
	if _, _, _, err := l.Lookup(claims.Key{ID: "a"}); !errors.Is(err, boltfile.ErrDamaged) {
		t.Fatalf("Lookup: %v", err)
	}
	// A writer on the same file is stopped too, not told "not applied".
	if err := l.db.View(func(tx *bolt.Tx) error { return l.SkipIfApplied(claims.Key{ID: "a"}, hashOf("p-a"))(tx) }); !errors.Is(err, boltfile.ErrDamaged) {
		t.Fatalf("SkipIfApplied: %v", err)
	}
	// The other keys are unaffected.
	if _, v := claimT(t, l, claims.Key{ID: "b"}, "p-b"); v != claims.Duplicate {
		t.Fatalf("b: %v", v)
	}
}

func TestVerifiedOpenRefusesDamagedOrMissingEntries(t *testing.T) {
	t.Run("checksum", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "l.db")
		l := openT(t, path, Options{})
		commitKeys(t, l, "a", "b", "c")
		flipEntry(t, l, "b", 3)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		_, err := Open(path, Options{Verify: boltfile.VerifyAlways})
		if !errors.Is(err, boltfile.ErrDamaged) || !strings.Contains(err.Error(), "1 dedup ledger entries fail their checksum") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "l.db")
		l := openT(t, path, Options{})
		commitKeys(t, l, "a", "b", "c")
		k, _ := encodeKey(claims.Key{ID: "b"})
		if err := l.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketKeys).Delete(k) }); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		_, err := Open(path, Options{Verify: boltfile.VerifyAlways})
		if !errors.Is(err, boltfile.ErrDamaged) || !strings.Contains(err.Error(), "says 3 dedup ledger keys are applied but 2") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestLedgerWrittenBeforeChecksumsIsUpgraded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	n := upgradeBatch + 3
	// The layout written before checksums: version 1, 41 bytes, no mark.
	f, err := boltfile.AcquireWith(path, boltfile.Options{Create: otherComponent})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if err := f.Update(func(tx *bolt.Tx) error {
		keys, _ := tx.CreateBucket(bucketKeys)
		times, _ := tx.CreateBucket(bucketTime)
		meta, _ := tx.CreateBucket(bucketMeta)
		for i := range n {
			k, _ := encodeKey(claims.Key{ID: fmt.Sprintf("old-%d", i)})
			h := hashOf(fmt.Sprintf("p%d", i))
			v := append([]byte{valueVersionV1}, binary.BigEndian.AppendUint64(nil, uint64(at.UnixNano()))...)
			if err := keys.Put(k, append(v, h[:]...)); err != nil {
				return err
			}
			if err := times.Put(timeKey(at, k), nil); err != nil {
				return err
			}
		}
		return boltfile.PutUint64(meta, keyCount, uint64(n))
	}); err != nil {
		t.Fatal(err)
	}
	_ = f.Release()

	l := openT(t, path, Options{Verify: boltfile.VerifyAlways})
	if l.Stats().Keys != int64(n) {
		t.Fatalf("keys = %d", l.Stats().Keys)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		if _, v := claimT(t, l, claims.Key{ID: fmt.Sprintf("old-%d", i)}, fmt.Sprintf("p%d", i)); v != claims.Duplicate {
			t.Fatalf("old-%d: %v, want duplicate", i, v)
		}
	}
	if err := l.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketMeta).Get(boltfile.KeyChecksums) == nil {
			return errors.New("no checksums mark")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestLedgerRefusesARolledBackFileUnlessAccepted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.db")
	l := openT(t, path, Options{})
	commitKeys(t, l, "a")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// b's commit is the file's last transaction (Close stores the clock
	// after a ledger's own last commit).
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := encodeKey(claims.Key{ID: "b"})
	if err := db.Update(func(tx *bolt.Tx) error {
		_, _, err := put(tx, enc, hashOf("p-b"), time.Now())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	damageNewestMeta(t, path)
	_, err = Open(path, Options{})
	if err == nil || !strings.Contains(err.Error(), "1 commit behind") || !strings.Contains(err.Error(), "accept_rollback") {
		t.Fatalf("err = %v", err)
	}
	l2 := openT(t, path, Options{AcceptRollback: true})
	// What the refusal was about: the last commit's key is forgotten.
	if applied, _, _, _ := l2.Lookup(claims.Key{ID: "b"}); applied {
		t.Fatal("expected key b to be rolled back")
	}
}

// damageNewestMeta flips a checksum byte of the meta page with the higher
// transaction ID (bbolt's layout: 16-byte page header, txid at 48,
// checksum at 56 of the meta struct).
func damageNewestMeta(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ps := int64(binary.NativeEndian.Uint32(b[16+8:]))
	tx0 := binary.NativeEndian.Uint64(b[16+48:])
	tx1 := binary.NativeEndian.Uint64(b[ps+16+48:])
	off := int64(16 + 56)
	if tx1 > tx0 {
		off += ps
	}
	b[off] ^= 0x5a
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestUnreadableEntryStopsTheUpgrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	f, err := boltfile.AcquireWith(path, boltfile.Options{Create: otherComponent})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Update(func(tx *bolt.Tx) error {
		keys, _ := tx.CreateBucket(bucketKeys)
		_, _ = tx.CreateBucket(bucketTime)
		_, _ = tx.CreateBucket(bucketMeta)
		k, _ := encodeKey(claims.Key{ID: "x"})
		return keys.Put(k, []byte{valueVersionV1, 0, 0})
	}); err != nil {
		t.Fatal(err)
	}
	_ = f.Release()
	_, err = Open(path, Options{})
	if !errors.Is(err, boltfile.ErrDamaged) || !strings.Contains(err.Error(), "adding checksums") || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v", err)
	}
}

// otherComponent creates a file the way another component sharing it (an
// outbox) would, with a bucket of its own.
func otherComponent(tx *bolt.Tx) error {
	_, err := tx.CreateBucket([]byte("other"))
	return err
}

// TestLedgerWithPartOfItsBucketsIsRefused: the three buckets are created
// together, so a file holding some of them lost the rest to damage; it is
// refused naming the file, never completed with empty buckets (which would
// apply every event again).
func TestLedgerWithPartOfItsBucketsIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openT(t, path, Options{})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketKeys) }); err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	_, err = Open(path, Options{})
	if !errors.Is(err, boltfile.ErrDamaged) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open: %v, want a damaged-file refusal naming %s", err, path)
	}
}
