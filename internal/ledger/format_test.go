package ledger

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
)

// A ledger names its format; one written by a newer release — its marker
// or an entry of a newer version — is refused at open, untouched.
func TestNewerLedgerFormatIsRefusedUntouched(t *testing.T) {
	for _, c := range []struct {
		name, what string
		verify     boltfile.Verify
		stamp      func(tx *bolt.Tx) error
	}{
		{"marker", "the dedup ledger", boltfile.VerifyNever, func(tx *bolt.Tx) error {
			return boltfile.PutUint64(tx.Bucket(bucketMeta), boltfile.KeyFormat, valueVersion+1)
		}},
		{"last entry", `dedup ledger entry "\x00\x00c"`, boltfile.VerifyNever, newerEntryOf("c")},
		{"middle entry, verified", `dedup ledger entry "\x00\x00b"`, boltfile.VerifyAlways, newerEntryOf("b")},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "l.db")
			l := openT(t, path, Options{})
			commitKeys(t, l, "a", "b", "c")
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			var stored []byte
			_ = db.View(func(tx *bolt.Tx) error {
				stored = append(stored, tx.Bucket(bucketMeta).Get(boltfile.KeyFormat)...)
				return nil
			})
			if len(stored) != 8 || binary.BigEndian.Uint64(stored) != valueVersion {
				t.Fatalf("a new ledger stores format %x, want %d", stored, valueVersion)
			}
			if err := db.Update(c.stamp); err != nil {
				t.Fatal(err)
			}
			db.Close()
			before, _ := os.ReadFile(path)
			_, err = Open(path, Options{Verify: c.verify})
			if !format.IsNewer(err) {
				t.Fatalf("Open: %v, want a newer-format refusal", err)
			}
			for _, s := range []string{path, c.what, fmt.Sprintf("format version %d", valueVersion+1), fmt.Sprintf("reads versions 1 to %d", valueVersion), "run the release that wrote it"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the refusal does not say %q: %v", s, err)
				}
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Fatal("the refused file was written")
			}
			// `ledger stat` (Check) refuses it the same way.
			ro, err := boltfile.OpenReadOnly(path, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer ro.Close()
			if err := ro.View(func(tx *bolt.Tx) error { _, err := Check(tx, path); return err }); !format.IsNewer(err) {
				t.Fatalf("Check: %v, want a newer-format refusal", err)
			}
		})
	}
}

// newerEntryOf re-stamps the entry of id as the next version, checksum
// and all: what a newer release would have written.
func newerEntryOf(id string) func(tx *bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		k, _ := encodeKey(claims.Key{ID: id})
		b := tx.Bucket(bucketKeys)
		v := append([]byte(nil), b.Get(k)...)
		v[0] = valueVersion + 1
		binary.BigEndian.PutUint32(v[valueLenV1:], boltfile.Checksum(k, v[:valueLenV1]))
		return b.Put(k, v)
	}
}
