package boltfile

import (
	"path/filepath"
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
