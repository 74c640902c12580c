// Package boltwalk follows a bbolt file's tree by reading the file itself,
// not bbolt's memory map, and refuses what bbolt's own traversal cannot
// survive: bbolt (and its Tx.Check) recurses without a visited set, so a
// branch pointing back up loops until the stack overflows — a fatal error
// no recover catches — and an element pointing past its page faults on a
// goroutine the caller does not control. bbolt walks the whole tree that
// way when it opens a file read-write without a synced freelist.
//
// It imports no bbolt, so both the output's files (internal/boltfile) and
// the embedded broker's store, which the input links, check a tree the
// same way.
package boltwalk

import (
	"encoding/binary"
	"fmt"
	"os"
)

// Damage is a tree Walk refused; Cause says what it found where.
type Damage struct{ Cause string }

func (d *Damage) Error() string { return d.Cause }

// Walk checks the tree of the bbolt file at path from its root page: every
// page id lies below the high-water mark hwm (pages in use; valid ids are
// 2 .. hwm-1), names itself, is a branch or a leaf, is reached once, and
// every element's key and value lie inside its page. A tree that fails is
// a *Damage; a file it cannot read, another error.
func Walk(path string, pageSize int64, hwm, root uint64) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("bbolt file %s: %w", path, err)
	}
	defer f.Close()
	w := &pageWalker{f: f, pageSize: pageSize, hwm: hwm, seen: map[uint64]bool{}}
	return w.page(root, 0)
}

type pageWalker struct {
	f        *os.File
	pageSize int64
	hwm      uint64 // pages in use; valid ids are 2 .. hwm-1
	seen     map[uint64]bool
	bufs     [][]byte // one page buffer per tree level, reused
}

const (
	bbBranch     = 0x01
	bbLeaf       = 0x02
	bbBucketElem = 0x01 // leaf element flag: the value is a nested bucket
	bbElemLen    = 16
	bbInBucket   = 16 // root page id + sequence
	maxTreeDepth = 64 // far deeper than any real bbolt tree
)

func (w *pageWalker) damaged(format string, args ...any) error {
	return &Damage{Cause: fmt.Sprintf(format, args...)}
}

// page checks the page id and everything below it.
func (w *pageWalker) page(id uint64, depth int) error {
	if depth > maxTreeDepth {
		return w.damaged("the tree is deeper than %d pages at page %d", maxTreeDepth, id)
	}
	if id < 2 || id >= w.hwm {
		return w.damaged("a page refers to page %d, outside the %d pages in use", id, w.hwm)
	}
	if w.seen[id] {
		return w.damaged("page %d is referred to twice (a loop or a shared page)", id)
	}
	for len(w.bufs) <= depth {
		w.bufs = append(w.bufs, make([]byte, w.pageSize))
	}
	buf := w.bufs[depth][:w.pageSize]
	if _, err := w.f.ReadAt(buf, int64(id)*w.pageSize); err != nil {
		return w.damaged("reading page %d: %v", id, err)
	}
	overflow := uint64(binary.NativeEndian.Uint32(buf[12:]))
	if got := binary.NativeEndian.Uint64(buf); got != id {
		return w.damaged("page %d names itself %d", id, got)
	}
	if id+overflow >= w.hwm {
		return w.damaged("page %d runs %d pages past the %d in use", id, overflow, w.hwm)
	}
	for i := id; i <= id+overflow; i++ {
		w.seen[i] = true
	}
	if overflow > 0 {
		buf = append(buf, make([]byte, int64(overflow)*w.pageSize)...)
		w.bufs[depth] = buf
		if _, err := w.f.ReadAt(buf[w.pageSize:], int64(id+1)*w.pageSize); err != nil {
			return w.damaged("reading page %d: %v", id, err)
		}
	}
	return w.elements(buf, id, depth)
}

// elements checks the elements of one page (or an inline bucket's page
// inside a leaf value) held in buf.
func (w *pageWalker) elements(buf []byte, id uint64, depth int) error {
	if len(buf) < 16 {
		return w.damaged("page %d: an inline page of %d bytes", id, len(buf))
	}
	flags := binary.NativeEndian.Uint16(buf[8:])
	count := int(binary.NativeEndian.Uint16(buf[10:]))
	if flags != bbBranch && flags != bbLeaf {
		return w.damaged("page %d has type %#x where a branch or leaf page belongs", id, flags)
	}
	if 16+count*bbElemLen > len(buf) {
		return w.damaged("page %d claims %d elements, more than fit in it", id, count)
	}
	for i := range count {
		e := 16 + i*bbElemLen
		el := buf[e : e+bbElemLen]
		if flags == bbBranch {
			pos, ksize := int(binary.NativeEndian.Uint32(el)), int(binary.NativeEndian.Uint32(el[4:]))
			if e+pos+ksize > len(buf) {
				return w.damaged("page %d: element %d points outside the page", id, i)
			}
			if err := w.page(binary.NativeEndian.Uint64(el[8:]), depth+1); err != nil {
				return err
			}
			continue
		}
		eflags := binary.NativeEndian.Uint32(el)
		pos := int(binary.NativeEndian.Uint32(el[4:]))
		ksize, vsize := int(binary.NativeEndian.Uint32(el[8:])), int(binary.NativeEndian.Uint32(el[12:]))
		end := e + pos + ksize + vsize
		if pos < 0 || ksize < 0 || vsize < 0 || end > len(buf) || end < e {
			return w.damaged("page %d: element %d points outside the page", id, i)
		}
		if eflags&bbBucketElem == 0 {
			continue
		}
		v := buf[e+pos+ksize : end]
		if len(v) < bbInBucket {
			return w.damaged("page %d: element %d is a bucket of %d bytes", id, i, len(v))
		}
		if root := binary.NativeEndian.Uint64(v); root != 0 {
			if err := w.page(root, depth+1); err != nil {
				return err
			}
		} else if err := w.elements(v[bbInBucket:], id, depth+1); err != nil {
			return err
		}
	}
	return nil
}
