package embedded

import (
	"encoding/binary"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// storeOnDisk starts and stops a broker in a new directory and returns its
// URL and the store file it left.
func storeOnDisk(t *testing.T) (u, path string) {
	t.Helper()
	dir := t.TempDir()
	u = "embedded://?dir=" + url.QueryEscape(dir)
	b, err := Acquire(u)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	return u, filepath.Join(dir, storeFile)
}

// bbolt's meta page: a 16-byte page header, then magic, version, page size
// and flags (4 bytes each), the root bucket (root page, sequence), the
// freelist page, the high-water mark and the txid (8 bytes each).
const (
	metaRootOff     = 16 + 16
	metaFreelistOff = 16 + 32
	metaTxidOff     = 16 + 48
)

// newestMeta reads both meta pages of a bbolt file with 4 KiB pages and
// returns the one of the later commit.
func newestMeta(t *testing.T, raw []byte) []byte {
	t.Helper()
	const page = 4096
	if len(raw) < 2*page || binary.NativeEndian.Uint32(raw[16+8:]) != page {
		t.Fatalf("not a bbolt file of 4 KiB pages (%d bytes)", len(raw))
	}
	m0, m1 := raw[:page], raw[page:2*page]
	if binary.NativeEndian.Uint64(m1[metaTxidOff:]) > binary.NativeEndian.Uint64(m0[metaTxidOff:]) {
		return m1
	}
	return m0
}

// The store writes no freelist (one page less per commit), so bbolt walks
// the tree at every open; a damaged page there is refused with the file and
// what to do, where bbolt's own walk would crash the process.
func TestADamagedStoreIsRefusedNotACrash(t *testing.T) {
	u, path := storeOnDisk(t)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	meta := newestMeta(t, raw)
	if fl := binary.NativeEndian.Uint64(meta[metaFreelistOff:]); fl != ^uint64(0) {
		t.Fatalf("the store's last commit wrote a freelist (page %d)", fl)
	}
	// The root page claims more elements than a page holds.
	root := binary.NativeEndian.Uint64(meta[metaRootOff:])
	binary.NativeEndian.PutUint16(raw[root*4096+10:], 0xffff)
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := Acquire(u)
	if err == nil {
		_ = b.Release()
		t.Fatal("a damaged store was opened")
	}
	for _, s := range []string{path, "damaged", "claims 65535 elements", "mv " + path} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the refusal does not say %q: %v", s, err)
		}
	}
}
