package damage

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"testing"
)

// bbolt's on-disk layout, as far as the variants need it: a page starts
// with id (8), flags (2), count (2), overflow (4); leaf elements are
// flags, pos, ksize, vsize (4 each), branch elements pos, ksize (4 each)
// and a child page id (8). Meta pages are 0 and 1; the meta struct
// follows the page header, its txid at 48 and checksum at 56.
const (
	pageSize      = 4096
	flagBranch    = 0x01
	flagLeaf      = 0x02
	pageHeaderLen = 16
	elemLen       = 16
	metaTxidOff   = pageHeaderLen + 48
	metaSumOff    = pageHeaderLen + 56
)

type page struct {
	id    int64
	flags uint16
	count int
}

// pages lists the branch and leaf pages of a file (pages whose header
// names their own id).
func pages(b []byte) []page {
	var out []page
	for id := int64(2); (id+1)*pageSize <= int64(len(b)); id++ {
		p := b[id*pageSize:]
		if int64(binary.NativeEndian.Uint64(p)) != id {
			continue
		}
		fl := binary.NativeEndian.Uint16(p[8:])
		if fl == flagBranch || fl == flagLeaf {
			out = append(out, page{id: id, flags: fl, count: int(binary.NativeEndian.Uint16(p[10:]))})
		}
	}
	return out
}

// leafKeys returns the keys on each leaf page.
func leafKeys(b []byte) map[int64][]string {
	out := map[int64][]string{}
	for _, p := range pages(b) {
		if p.flags != flagLeaf {
			continue
		}
		base := p.id*pageSize + pageHeaderLen
		for i := 0; i < p.count; i++ {
			e := base + int64(i*elemLen)
			pos := int64(binary.NativeEndian.Uint32(b[e+4:]))
			ksize := int64(binary.NativeEndian.Uint32(b[e+8:]))
			if e+pos+ksize > int64(len(b)) {
				break
			}
			out[p.id] = append(out[p.id], string(b[e+pos:e+pos+ksize]))
		}
	}
	return out
}

// variant damages a copy of a file and names the pages it touched (nil:
// none in particular; all: every page).
type variant struct {
	name   string
	damage func(t *testing.T, b []byte, rng *rand.Rand, leaves []int64) (out []byte, touched []int64, all bool)
}

func pick(rng *rand.Rand, ids []int64) int64 { return ids[rng.IntN(len(ids))] }

func newestMeta(b []byte) int64 {
	if binary.NativeEndian.Uint64(b[pageSize+metaTxidOff:]) > binary.NativeEndian.Uint64(b[metaTxidOff:]) {
		return 1
	}
	return 0
}

// highWater is the number of pages the newest commit uses; the file may
// be longer (bbolt grows it in steps).
func highWater(b []byte) int64 {
	m := newestMeta(b)
	return int64(binary.NativeEndian.Uint64(b[m*pageSize+pageHeaderLen+40:]))
}

// variants are the damage kinds of issue 8, each applied to a file the
// binary wrote. leaves are the leaf pages that hold the records (or keys)
// under test.
func variants() []variant {
	flip := func(n int) func(*testing.T, []byte, *rand.Rand, []int64) ([]byte, []int64, bool) {
		return func(t *testing.T, b []byte, rng *rand.Rand, leaves []int64) ([]byte, []int64, bool) {
			id := pick(rng, leaves)
			for range n {
				b[id*pageSize+int64(rng.IntN(pageSize))] ^= byte(1 + rng.IntN(255))
			}
			return b, []int64{id}, false
		}
	}
	count := func(delta int) func(*testing.T, []byte, *rand.Rand, []int64) ([]byte, []int64, bool) {
		return func(t *testing.T, b []byte, rng *rand.Rand, leaves []int64) ([]byte, []int64, bool) {
			id := pick(rng, leaves)
			off := id*pageSize + 10
			c := int(binary.NativeEndian.Uint16(b[off:]))
			binary.NativeEndian.PutUint16(b[off:], uint16(max(c+delta, 1)))
			return b, []int64{id}, false
		}
	}
	var vs []variant
	for seed := range 3 { // the random flips hit different places per seed
		vs = append(vs,
			variant{fmt.Sprintf("flip one byte in a leaf #%d", seed), flip(1)},
			variant{fmt.Sprintf("flip eight bytes in a leaf #%d", seed), flip(8)},
			variant{fmt.Sprintf("flip 64 bytes in a leaf #%d", seed), flip(64)})
	}
	return append(vs, []variant{
		{"leaf element count raised", count(+11)},
		{"leaf element count lowered", count(-11)},
		{"leaf page zeroed", func(t *testing.T, b []byte, rng *rand.Rand, leaves []int64) ([]byte, []int64, bool) {
			id := pick(rng, leaves)
			clear(b[id*pageSize : (id+1)*pageSize])
			return b, []int64{id}, false
		}},
		{"branch pointer changed", func(t *testing.T, b []byte, rng *rand.Rand, leaves []int64) ([]byte, []int64, bool) {
			var branches []page
			for _, p := range pages(b) {
				if p.flags == flagBranch {
					branches = append(branches, p)
				}
			}
			if len(branches) == 0 {
				t.Fatal("the file has no branch page; write more records")
			}
			p := branches[rng.IntN(len(branches))]
			e := p.id*pageSize + pageHeaderLen + int64(rng.IntN(p.count)*elemLen)
			child := binary.NativeEndian.Uint64(b[e+8:])
			binary.NativeEndian.PutUint64(b[e+8:], child+1)
			// What the old child held is now unreachable: count every page
			// as touched only through the refusal it must cause.
			return b, []int64{int64(child)}, false
		}},
		{"newest meta page flipped", func(t *testing.T, b []byte, rng *rand.Rand, leaves []int64) ([]byte, []int64, bool) {
			b[newestMeta(b)*pageSize+metaSumOff] ^= 0x5a
			return b, nil, false
		}},
		{"newest meta page zeroed", func(t *testing.T, b []byte, rng *rand.Rand, leaves []int64) ([]byte, []int64, bool) {
			m := newestMeta(b)
			clear(b[m*pageSize : (m+1)*pageSize])
			return b, nil, false
		}},
		{"both meta pages zeroed", func(t *testing.T, b []byte, rng *rand.Rand, leaves []int64) ([]byte, []int64, bool) {
			clear(b[:2*pageSize])
			return b, nil, true
		}},
		{"truncated to half its used pages", func(t *testing.T, b []byte, rng *rand.Rand, leaves []int64) ([]byte, []int64, bool) {
			return b[:highWater(b)/2*pageSize], nil, true
		}},
		{"truncated inside its last used page", func(t *testing.T, b []byte, rng *rand.Rand, leaves []int64) ([]byte, []int64, bool) {
			return b[:highWater(b)*pageSize-1000], nil, true
		}},
	}...)
}

// damaged writes variant v of the file at src to dst and returns the pages
// it touched.
func damaged(t *testing.T, v variant, src, dst string, seed uint64, leaves []int64) (touched map[int64]bool, all bool) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 8))
	out, ids, all := v.damage(t, b, rng, leaves)
	if err := os.WriteFile(dst, out, 0o600); err != nil {
		t.Fatal(err)
	}
	touched = map[int64]bool{}
	for _, id := range ids {
		touched[id] = true
	}
	return touched, all
}

// liveLeaves returns the leaf pages reachable from the newest commit's
// root (a file also holds stale copies that bbolt freed: damaging those
// proves nothing).
func liveLeaves(b []byte) map[int64]bool {
	live := map[int64]bool{}
	seen := map[int64]bool{}
	var walk func(id int64)
	walk = func(id int64) {
		if id < 2 || (id+1)*pageSize > int64(len(b)) || seen[id] {
			return
		}
		seen[id] = true
		p := b[id*pageSize:]
		count := int(binary.NativeEndian.Uint16(p[10:]))
		for i := range count {
			e := p[pageHeaderLen+i*elemLen:]
			switch binary.NativeEndian.Uint16(p[8:]) {
			case flagBranch:
				walk(int64(binary.NativeEndian.Uint64(e[8:])))
			case flagLeaf:
				live[id] = true
				if binary.NativeEndian.Uint32(e)&1 == 1 { // a nested bucket
					pos, ksize := int(binary.NativeEndian.Uint32(e[4:])), int(binary.NativeEndian.Uint32(e[8:]))
					walk(int64(binary.NativeEndian.Uint64(e[pos+ksize:])))
				}
			}
		}
	}
	walk(int64(binary.NativeEndian.Uint64(b[newestMeta(b)*pageSize+pageHeaderLen+16:])))
	return live
}

// leavesHolding returns the live leaf pages holding any of keys, sorted.
func leavesHolding(b []byte, keys map[string]bool) []int64 {
	live := liveLeaves(b)
	var ids []int64
	for id, ks := range leafKeys(b) {
		if !live[id] {
			continue
		}
		for _, k := range ks {
			if keys[k] {
				ids = append(ids, id)
				break
			}
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}
