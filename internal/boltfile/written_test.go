package boltfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// A commit of one small key writes its leaf, the root bucket's page and a
// meta page, and no freelist page: WrittenBytes counts them in pages.
func TestWrittenBytesCountsACommitsPagesAndNoFreelist(t *testing.T) {
	f, err := acquireT(filepath.Join(t.TempDir(), "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	page := int64(f.DB().Info().PageSize)
	before := f.WrittenBytes()
	if err := f.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("owner")).Put([]byte("k"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	got := f.WrittenBytes() - before
	if got%page != 0 || got < 2*page || got > 3*page {
		t.Fatalf("one small commit wrote %d bytes, want 2 or 3 pages of %d (leaf, root, meta; no freelist)", got, page)
	}
}

// metasOf reads the file's two meta pages.
func metasOf(t *testing.T, path string) (m0, m1 metaPage) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	m0, m1, _, err = readMetas(path, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	return m0, m1
}

// A clean release writes the freelist once, so the next open reads it; a
// file left by a crash has none, and its next open walks the tree before
// bbolt rebuilds the freelist from it: a damaged leaf is then refused
// even without verification, instead of crashing bbolt's own walk.
func TestOpenAfterACrashWalksTheTree(t *testing.T) {
	path := filepath.Join(t.TempDir(), "crash.db")
	makeOurs(t, path)
	if !syncedFreelist(metasOf(t, path)) {
		t.Fatal("after a clean release the file has no freelist")
	}
	f, err := acquireT(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("owner")).Put([]byte("k"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	resetRegistry(t) // closes the file as a crash leaves it: no last commit
	if syncedFreelist(metasOf(t, path)) {
		t.Fatal("a commit wrote the freelist; want it written only at a clean release")
	}
	raiseLeafCount(t, path)
	_, err = AcquireWith(path, Options{Verify: VerifyNever})
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "points outside the page") {
		t.Fatalf("err = %v, want a refusal from the walk at open", err)
	}
}
