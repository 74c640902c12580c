package boltfile

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func TestForeignFileShorterThanTwoPagesIsClassifiedAsForeign(t *testing.T) {
	path := filepath.Join(t.TempDir(), "small.db")
	buf := make([]byte, 7500)
	_, _ = rand.Read(buf)
	writeFile(t, path, buf)
	_, err := acquireT(path)
	if err == nil || !strings.Contains(err.Error(), "not a usable bbolt database") || !strings.Contains(err.Error(), path) ||
		strings.Contains(err.Error(), "file size too small") {
		t.Fatalf("err = %v, want the foreign-file refusal naming %s", err, path)
	}
}

// metaOffsets returns the file offsets of meta pages 0 and 1 and which one
// holds the newest commit.
func metaOffsets(t *testing.T, path string) (offs [2]int64, newest int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m0 := parseMeta(b)
	m1 := parseMeta(b[m0.pageSize:])
	if !m0.valid || !m1.valid {
		t.Fatal("test file has a damaged meta page already")
	}
	offs = [2]int64{0, m0.pageSize}
	if m1.txid > m0.txid {
		return offs, 1
	}
	return offs, 0
}

func flipAt(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

// writeCommits writes one key per commit into bucket "data".
func writeCommits(t *testing.T, path string, keys ...string) {
	t.Helper()
	f, err := acquireT(path)
	if err != nil {
		t.Fatal(err)
	}
	// Closed as a crash leaves it, without the release's freelist commit:
	// the newest commit is the last key's.
	defer resetRegistry(t)
	for _, k := range keys {
		if err := f.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("data"))
			if err != nil {
				return err
			}
			return b.Put([]byte(k), []byte("v"))
		}); err != nil {
			t.Fatal(err)
		}
	}
}

func hasKey(t *testing.T, f *File, k string) bool {
	t.Helper()
	found := false
	if err := f.View(func(tx *bolt.Tx) error {
		found = tx.Bucket([]byte("data")).Get([]byte(k)) != nil
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return found
}

func TestDamagedNewestMetaPageIsARollbackRefusedUnlessAccepted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meta.db")
	writeCommits(t, path, "first", "last")
	offs, newest := metaOffsets(t, path)
	// A byte of the newest page's checksum: its txid stays readable.
	flipAt(t, path, offs[newest]+pageHeaderLen+metaSumOff)
	before, _ := os.ReadFile(path)

	_, err := acquireT(path)
	if err == nil || !strings.Contains(err.Error(), "1 commit behind") || !strings.Contains(err.Error(), "accept_rollback") ||
		!strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v, want a refusal saying the file is 1 commit behind", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("the refused file was changed")
	}

	f, err := AcquireWith(path, Options{AcceptRollback: true})
	if err != nil {
		t.Fatal(err)
	}
	md := f.MetaDamage()
	if md == nil || md.CommitsBack != 1 || md.Page != newest {
		t.Fatalf("MetaDamage = %+v, want page %d, 1 commit back", md, newest)
	}
	// This is what the refusal protects against: the last commit is gone.
	if !hasKey(t, f, "first") || hasKey(t, f, "last") {
		t.Fatal("expected the file to be rolled back to before the last commit")
	}
	// A joiner that does not accept the rollback is refused too.
	if _, err := acquireT(path); err == nil {
		t.Fatal("a second Acquire without AcceptRollback joined a rolled-back file")
	}
	// The next commit rewrites the damaged page: the flag is needed once.
	if err := f.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("data")).Put([]byte("after"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	_ = f.Release()
	f, err = acquireT(path)
	if err != nil {
		t.Fatalf("after one commit the file still needs AcceptRollback: %v", err)
	}
	if f.MetaDamage() != nil || !hasKey(t, f, "after") {
		t.Fatalf("MetaDamage = %v after a commit", f.MetaDamage())
	}
	_ = f.Release()
}

func TestDamagedOlderMetaPageLosesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meta.db")
	writeCommits(t, path, "first", "last")
	offs, newest := metaOffsets(t, path)
	flipAt(t, path, offs[1-newest]+pageHeaderLen+metaSumOff)
	f, err := acquireT(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	if md := f.MetaDamage(); md == nil || md.RolledBack() {
		t.Fatalf("MetaDamage = %+v, want the older page reported, nothing rolled back", md)
	}
	if !hasKey(t, f, "last") {
		t.Fatal("last commit missing")
	}
}

func TestUnreadableTxidOfADamagedMetaPageCountsAsRollback(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meta.db")
	writeCommits(t, path, "first", "last")
	offs, newest := metaOffsets(t, path)
	flipAt(t, path, offs[newest]+pageHeaderLen+metaTxidOff+7)
	_, err := acquireT(path)
	if err == nil || !strings.Contains(err.Error(), "may be 1 commit behind") {
		t.Fatalf("err = %v, want 'may be 1 commit behind'", err)
	}
}

// leafPages returns the ids of leaf pages in the file (page header flag 0x02).
func leafPages(t *testing.T, path string, pageSize int64) []int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for id := int64(2); (id+1)*pageSize <= int64(len(b)); id++ {
		p := b[id*pageSize:]
		if binary.NativeEndian.Uint64(p) == uint64(id) && binary.NativeEndian.Uint16(p[8:]) == 0x02 {
			ids = append(ids, id)
		}
	}
	return ids
}

// raiseLeafCount raises the element count of a data leaf in the middle of
// the file: bbolt would read elements that are not there.
func raiseLeafCount(t *testing.T, path string) {
	t.Helper()
	leaves := leafPages(t, path, 4096)
	if len(leaves) < 3 {
		t.Fatalf("only %d leaf pages", len(leaves))
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	off := leaves[len(leaves)/2]*4096 + 10
	var c [2]byte
	if _, err := f.ReadAt(c[:], off); err != nil {
		t.Fatal(err)
	}
	binary.NativeEndian.PutUint16(c[:], binary.NativeEndian.Uint16(c[:])+40)
	if _, err := f.WriteAt(c[:], off); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyRefusesAFileWithALeafCountChanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leaf.db")
	makeOurs(t, path)
	raiseLeafCount(t, path)

	_, err := AcquireWith(path, Options{Verify: VerifyNever})
	if err != nil {
		t.Fatalf("without verification the damage is not visible at open after a clean close: %v", err)
	}
	// (Released by the registry reset below.)
	resetRegistry(t)
	_, err = AcquireWith(path, Options{Verify: VerifyAlways})
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "move the file aside") {
		t.Fatalf("err = %v, want a damaged-file refusal", err)
	}
}

func resetRegistry(t *testing.T) {
	t.Helper()
	registry.Clear(func(s *sharedDB) { _ = s.db.Close() })
}

func TestPanicInsideBboltBecomesAStickyRefusal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.db")
	f, err := acquireT(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	err = f.View(func(tx *bolt.Tx) error { panic(fmt.Sprintf("assertion failed: Page expected to be: %d", 14)) })
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "Page expected to be: 14") {
		t.Fatalf("err = %v", err)
	}
	if err := f.Update(func(tx *bolt.Tx) error { return nil }); !errors.Is(err, ErrDamaged) {
		t.Fatalf("an Update after the panic: %v, want the same refusal", err)
	}
}
