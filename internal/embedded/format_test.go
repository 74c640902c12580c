package embedded

import (
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
)

// The store names its format (meta "schema"); one written by a newer
// release stops the broker with the file, the version found, the versions
// this build reads and what to do.
func TestStoreOfANewerFormatIsRefused(t *testing.T) {
	u, path := storeOnDisk(t)
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if v := string(meta.Get([]byte("schema"))); v != schemaVersion {
			t.Errorf("the store names format %q, want %q", v, schemaVersion)
		}
		return meta.Put([]byte("schema"), []byte("2"))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := Acquire(u)
	if err == nil {
		_ = b.Release()
		t.Fatal("a store of a newer format was opened")
	}
	if !format.IsNewer(err) {
		t.Fatalf("got %v, want a newer-format refusal", err)
	}
	for _, s := range []string{path, "the embedded broker's store", "format version 2", "reads versions 1 to 1", "run the release that wrote it"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the refusal does not say %q: %v", s, err)
		}
	}
}
