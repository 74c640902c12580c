package boltfile

import (
	"errors"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// testSection records what OpenSection asked of it.
func testSection(upgrades, verifies *int) Section {
	return Section{
		Name:     "test store",
		Buckets:  [][]byte{[]byte("t/entries"), []byte("t/meta")},
		Init:     func(meta *bolt.Bucket) error { return meta.Put([]byte("id"), []byte("x")) },
		Complete: func(meta *bolt.Bucket) bool { return meta.Get([]byte("id")) != nil },
		Upgrade:  func() error { *upgrades++; return nil },
		Verify:   func() error { *verifies++; return nil },
	}
}

func TestSectionIsCreatedOnceAndMarkedChecksummed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.db")
	var upgrades, verifies int
	s := testSection(&upgrades, &verifies)
	// A file created for another store: the section is added at open.
	f, err := AcquireWith(path, Options{Verify: VerifyAlways, Create: func(tx *bolt.Tx) error {
		_, err := tx.CreateBucket([]byte("other"))
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	if err := f.OpenSection(s); err != nil {
		t.Fatal(err)
	}
	if err := f.OpenSection(s); err != nil { // the second open finds it whole
		t.Fatal(err)
	}
	err = f.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket([]byte("t/meta"))
		if meta == nil || meta.Get(KeyChecksums) == nil || string(meta.Get([]byte("id"))) != "x" {
			return errors.New("the section was not created with its marker and Init's key")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if upgrades != 0 || verifies != 2 {
		t.Fatalf("%d upgrades, %d verifies; want none (a new section has no old entries) and one per open of a verified file", upgrades, verifies)
	}
}

func TestSectionWithoutTheMarkerIsUpgradedAndAPartOneIsDamage(t *testing.T) {
	dir := t.TempDir()
	var upgrades, verifies int
	s := testSection(&upgrades, &verifies)

	// Entries written before checksums: buckets and Init's key, no marker.
	old := filepath.Join(dir, "old.db")
	f, err := AcquireWith(old, Options{Verify: VerifyNever, Create: func(tx *bolt.Tx) error {
		entries, _ := tx.CreateBucket([]byte("t/entries"))
		meta, _ := tx.CreateBucket([]byte("t/meta"))
		_ = entries.Put([]byte("k"), []byte("v"))
		return meta.Put([]byte("id"), []byte("x"))
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	if err := f.OpenSection(s); err != nil {
		t.Fatal(err)
	}
	if upgrades != 1 || verifies != 0 {
		t.Fatalf("%d upgrades, %d verifies; want one upgrade and no verify (VerifyNever)", upgrades, verifies)
	}

	// Every bucket but without what Init writes: part of the section.
	part := filepath.Join(dir, "part.db")
	g, err := AcquireWith(part, Options{Create: func(tx *bolt.Tx) error {
		_, _ = tx.CreateBucket([]byte("t/entries"))
		_, err := tx.CreateBucket([]byte("t/meta"))
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	if err := g.OpenSection(s); !errors.Is(err, ErrDamaged) {
		t.Fatalf("a section without Init's key: %v, want ErrDamaged", err)
	}
}
