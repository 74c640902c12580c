package boltfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"runtime/debug"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltwalk"
)

// ErrDamaged reports a file whose structure bbolt cannot read safely.
var ErrDamaged = errors.New("damaged")

// DamagedError names a damaged file, what was found and what to do. It is
// errors.Is ErrDamaged.
type DamagedError struct {
	Path  string
	Cause string
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("bbolt file %s is %v (%s); refusing to use it: stop the process, move the file aside (mv %s %s.damaged) and start with a new file, or restore it from a backup (keep the moved file: it may hold records not yet delivered)",
		e.Path, ErrDamaged, e.Cause, e.Path, e.Path)
}

func (e *DamagedError) Unwrap() error { return ErrDamaged }

// guard runs fn and turns a panic or a memory fault inside bbolt — a
// damaged page makes bbolt assert or read outside its map — into a
// *DamagedError. Faults become panics only on the goroutine that asked, so
// fn must not start goroutines that read the file.
func guard(path string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = &DamagedError{Path: path, Cause: fmt.Sprintf("bbolt failed reading it: %v", r)}
		}
	}()
	return fn()
}

// View runs fn in a read transaction. A bbolt panic on a damaged page
// becomes a *DamagedError, and every later View or Update on this file
// returns it too: a tree bbolt cannot read must not be written.
func (f *File) View(fn func(*bolt.Tx) error) error {
	return f.shared.run(func() error { return f.shared.db.View(fn) })
}

// Update is View for a read-write transaction (rolled back on a panic).
func (f *File) Update(fn func(*bolt.Tx) error) error {
	return f.shared.run(func() error { return f.shared.db.Update(fn) })
}

func (s *sharedDB) run(fn func() error) error {
	if err := s.damaged.Load(); err != nil {
		return err
	}
	err := guard(s.path, fn)
	var d *DamagedError
	if errors.As(err, &d) {
		s.damaged.CompareAndSwap(nil, d)
	}
	return err
}

// MetaDamage describes a meta page that fails its checksum. bbolt keeps two
// meta pages and opens the newest one that checks out, without a word: when
// the damaged page held the newest commit, the file silently rolled back.
type MetaDamage struct {
	Path      string
	Page      int    // 0 or 1
	InUseTxid uint64 // the commit bbolt opens
	// CommitsBack is 1 when the damaged page names the commit after the one
	// in use (that commit is lost), 0 when it names the one before (nothing
	// lost), -1 when its own transaction ID is unreadable (unknown).
	CommitsBack int
}

// RolledBack reports whether the file may have lost its newest commit.
func (m *MetaDamage) RolledBack() bool { return m.CommitsBack != 0 }

func (m *MetaDamage) String() string {
	switch m.CommitsBack {
	case 0:
		return fmt.Sprintf("bbolt file %s: meta page %d is damaged; it held the commit before the one in use (%d), so nothing is lost, and the next commit rewrites it", m.Path, m.Page, m.InUseTxid)
	case 1:
		return fmt.Sprintf("bbolt file %s: meta page %d, which held the newest commit (%d), is damaged; bbolt falls back to the previous commit (%d): the file is 1 commit behind what was last written", m.Path, m.Page, m.InUseTxid+1, m.InUseTxid)
	default:
		return fmt.Sprintf("bbolt file %s: meta page %d is damaged beyond reading its commit number; bbolt uses commit %d from the other meta page, and the damaged page may have held a newer commit: the file may be 1 commit behind what was last written", m.Path, m.Page, m.InUseTxid)
	}
}

// bbolt's meta page: a 16-byte page header, then magic, version, page size,
// flags, root bucket (16), freelist, high-water page, txid and an FNV-64a
// checksum of the 56 bytes before it.
const (
	boltMagic       = 0xED0CDAED
	boltVersion     = 2
	pageHeaderLen   = 16
	metaLen         = 64
	metaFreelistOff = 32
	metaTxidOff     = 48
	metaSumOff      = 56
)

type metaPage struct {
	magic    bool // the magic number is there (a bbolt meta page, maybe damaged)
	valid    bool // magic, version and checksum all check out
	pageSize int64
	txid     uint64
	freelist uint64 // the freelist's page; noFreelist: none was written
}

// noFreelist is bbolt's freelist page id of a commit that wrote no
// freelist (NoFreelistSync).
const noFreelist = ^uint64(0)

// syncedFreelist reports whether the commit bbolt opens (the valid meta
// page with the higher txid) wrote a freelist, so that bbolt reads it
// instead of walking the tree to rebuild it.
func syncedFreelist(m0, m1 metaPage) bool {
	m := m0
	if !m0.valid || (m1.valid && m1.txid > m0.txid) {
		m = m1
	}
	return m.valid && m.freelist != noFreelist
}

func parseMeta(b []byte) metaPage {
	var m metaPage
	if len(b) < pageHeaderLen+metaLen {
		return m
	}
	b = b[pageHeaderLen : pageHeaderLen+metaLen]
	m.magic = binary.NativeEndian.Uint32(b) == boltMagic
	m.pageSize = int64(binary.NativeEndian.Uint32(b[8:]))
	m.txid = binary.NativeEndian.Uint64(b[metaTxidOff:])
	m.freelist = binary.NativeEndian.Uint64(b[metaFreelistOff:])
	h := fnv.New64a()
	h.Write(b[:metaSumOff])
	m.valid = m.magic && binary.NativeEndian.Uint32(b[4:]) == boltVersion &&
		h.Sum64() == binary.NativeEndian.Uint64(b[metaSumOff:])
	return m
}

// readMetas reads both meta pages of an existing file without bbolt. It
// returns ok=false when neither page carries bbolt's magic number (not a
// bbolt file, or too damaged to tell). The second page's offset is the page
// size the first names, or where bbolt itself would look for it.
func readMetas(path string, size int64) (m0, m1 metaPage, ok bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return m0, m1, false, fmt.Errorf("bbolt file %s: %w", path, err)
	}
	defer f.Close()
	buf := make([]byte, pageHeaderLen+metaLen)
	read := func(off int64) metaPage {
		if n, _ := f.ReadAt(buf, off); n < len(buf) {
			return metaPage{}
		}
		return parseMeta(buf)
	}
	m0 = read(0)
	if m0.valid {
		return m0, read(m0.pageSize), true, nil
	}
	for i := 0; i <= 14; i++ { // bbolt's own search: 1 KiB .. 16 MiB
		off := int64(1024) << i
		if off >= size {
			break
		}
		if m := read(off); m.valid {
			return m0, m, true, nil
		}
	}
	return m0, metaPage{}, m0.magic, nil
}

// metaDamage compares the two meta pages; nil when both check out.
func metaDamage(path string, m0, m1 metaPage) *MetaDamage {
	if m0.valid == m1.valid {
		return nil // both fine, or both bad (bbolt refuses the file itself)
	}
	good, bad, page := m0, m1, 1
	if m1.valid {
		good, bad, page = m1, m0, 0
	}
	d := &MetaDamage{Path: path, Page: page, InUseTxid: good.txid, CommitsBack: -1}
	// bbolt writes commit t to page t%2, so the damaged page held either
	// the commit before the one in use or the one after it; its own txid
	// field says which, if that field survived.
	switch {
	case bad.magic && bad.txid+1 == good.txid:
		d.CommitsBack = 0
	case bad.magic && bad.txid == good.txid+1:
		d.CommitsBack = 1
	}
	return d
}

// Verify says when Acquire checks the structure of an existing file.
type Verify string

const (
	VerifyAuto   Verify = "auto"   // files up to AutoVerifyMaxBytes
	VerifyAlways Verify = "always" // every file, whatever its size
	VerifyNever  Verify = "never"  // rely on the checks done on every read
)

// AutoVerifyMaxBytes is the largest file VerifyAuto checks at open (see
// docs/operations.md for what a check costs per size).
const AutoVerifyMaxBytes = 256 << 20

// VerifyValues are the values of a verify_on_start field, for the
// plugins' enum check.
var VerifyValues = []string{string(VerifyAuto), string(VerifyAlways), string(VerifyNever)}

func (v Verify) wants(size int64) bool {
	switch v {
	case VerifyAlways:
		return true
	case VerifyNever:
		return false
	}
	return size <= AutoVerifyMaxBytes
}

// verify walks every page the file references, reading the file itself
// (boltwalk: no loop, no read outside a page can follow), then runs bbolt's
// consistency check, which also finds pages both used and free, or
// neither, and keys out of order.
func verify(tx *bolt.Tx, path string) error {
	if err := walkTree(tx, path); err != nil {
		return err
	}
	const shown = 5
	var problems []string
	n := 0
	for err := range tx.Check() {
		if n < shown {
			problems = append(problems, err.Error())
		}
		n++
	}
	if n == 0 {
		return nil
	}
	if n > shown {
		problems = append(problems, fmt.Sprintf("and %d more", n-shown))
	}
	return &DamagedError{Path: path, Cause: "its consistency check failed: " + strings.Join(problems, "; ")}
}

// walkTree walks tx's tree with boltwalk.Walk.
func walkTree(tx *bolt.Tx, path string) error {
	pageSize := int64(tx.DB().Info().PageSize)
	root := uint64(tx.Cursor().Bucket().RootPage())
	err := boltwalk.Walk(path, pageSize, uint64(tx.Size()/pageSize), root)
	if d, ok := errors.AsType[*boltwalk.Damage](err); ok {
		return &DamagedError{Path: path, Cause: d.Cause}
	}
	return err
}
