package embedded

import (
	"log/slog"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"
)

// A synced change's commit is counted once: the first take has at least
// its leaf and meta page, the next finds nothing new.
func TestStoreWritesAreTakenOnce(t *testing.T) {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "broker.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	bucket := []byte("b")
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket(bucket); return err }); err != nil {
		t.Fatal(err)
	}
	w := newWriter(db, slog.New(slog.DiscardHandler))
	defer w.close()
	TakeStoreWritten() // whatever other tests of the package left
	if err := w.sync(change{bucket: bucket, key: []byte("k"), value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	page := int64(db.Info().PageSize)
	if n := TakeStoreWritten(); n < 2*page || n%page != 0 {
		t.Fatalf("one commit took %d bytes, want whole pages, at least a leaf and a meta page (%d each)", n, page)
	}
	if n := TakeStoreWritten(); n != 0 {
		t.Fatalf("a second take found %d bytes with no commit in between", n)
	}
}
