package powerloss

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A qemu guest loses only what it had not written out; a real disk may
// also lose, or keep out of order, the writes it held in its own cache
// between two flushes. qemu's blklogwrites driver records every write the
// guest sends to its disk, and every flush, in a log (dm-log-writes'
// format); replaying the log into a copy of the disk as it was before the
// boot gives each state the disk could be left in:
//
//   - every prefix ending at a flush: all writes before it, none after;
//   - between two flushes, a sample of the writes issued since the earlier
//     one, kept or lost at random and applied in a random order (a write
//     the disk lost, or one it wrote before an earlier one).
//
// Each state is opened with the binary's own code. An acknowledged record
// must be in every state at or after the flush that made it durable; we
// know that flush by an upper bound: the log's length when the host first
// saw the acknowledgement (the guest printed it after its fsync returned).

const (
	logMagic       = 0x6a736677736872
	logSector      = 512
	logFlush       = 1 << 0
	logFUA         = 1 << 1
	logDiscard     = 1 << 2
	logMark        = 1 << 3
	logEntryHeader = 32
)

// logEntry is one write (or flush) the guest sent to its disk.
type logEntry struct {
	sector, sectors uint64
	flags           uint64
	data            []byte
	end             int64 // the log's length once this entry was written
}

// readLog parses a blklogwrites log up to its last whole entry (qemu was
// killed: the superblock's count may be stale, the tail torn), and returns
// the bytes after it.
func readLog(t *testing.T, path string) (entries []logEntry, rest int64) {
	t.Helper()
	b := readFile(t, path)
	if len(b) < logSector || binary.LittleEndian.Uint64(b) != logMagic {
		t.Fatalf("%s is not a blklogwrites log (%d bytes)", path, len(b))
	}
	if ss := binary.LittleEndian.Uint32(b[24:]); ss != logSector {
		t.Fatalf("log sector size %d, want %d", ss, logSector)
	}
	var out []logEntry
	off := int64(logSector)
	for off+logSector <= int64(len(b)) {
		h := b[off:]
		e := logEntry{
			sector:  binary.LittleEndian.Uint64(h),
			sectors: binary.LittleEndian.Uint64(h[8:]),
			flags:   binary.LittleEndian.Uint64(h[16:]),
		}
		if e.flags&^(logFlush|logFUA|logDiscard|logMark) != 0 || (e.flags == 0 && e.sectors == 0) {
			break // not an entry: the torn tail
		}
		n := int64(0)
		if e.flags&logDiscard == 0 {
			n = int64(e.sectors) * logSector
		}
		if off+logSector+n > int64(len(b)) {
			break
		}
		e.data = b[off+logSector : off+logSector+n]
		off += logSector + n
		e.end = off
		out = append(out, e)
	}
	return out, int64(len(b)) - off
}

func apply(t *testing.T, f *os.File, e logEntry) {
	t.Helper()
	if e.flags&logDiscard != 0 || len(e.data) == 0 {
		return // a discarded range may read back as anything: keep the old bytes
	}
	if _, err := f.WriteAt(e.data, int64(e.sector)*logSector); err != nil {
		t.Fatal(err)
	}
}

// TestEveryFlushPointAndReorderingKeepsAcknowledgedRecords boots the
// outbox (A) and the bbolt ledger (B) once on a logged disk, cuts the
// power a few seconds into their writes, and checks every flush point of
// the log and a sample of reorderings between flushes: no violation.
func TestEveryFlushPointAndReorderingKeepsAcknowledgedRecords(t *testing.T) {
	if v := replay(t, "", 3); v != 0 {
		t.Fatalf("%d states lost acknowledged records", v)
	}
}

// TestFlushPointReplayOfTheNoSyncControlFindsLosses: the same replay of the
// no-sync build must find states without acknowledged records, or the
// replay could not see a missing fsync either.
func TestFlushPointReplayOfTheNoSyncControlFindsLosses(t *testing.T) {
	if v := replay(t, "powerloss_nosync", 4); v == 0 {
		t.Fatal("the replay of a build that never fsyncs found no state missing an acknowledged record")
	}
}

// replay runs the scenario once on a logged disk and checks the states;
// it returns the number of states missing acknowledged records (it stops
// at the first such flush point).
func replay(t *testing.T, tags string, stream uint64) (violations int) {
	rng := testRand(t, stream)
	g := newGuest(t, tags, "a b")
	dir := t.TempDir()
	img, base, logf := filepath.Join(dir, "disk.img"), filepath.Join(dir, "base.img"), filepath.Join(dir, "writes.log")
	disk(t, img, 48)
	if err := os.WriteFile(base, readFile(t, img), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(logf, nil, 0o600); err != nil { // qemu opens, not creates, the log
		t.Fatal(err)
	}
	d := &drive{
		args: []string{
			"-blockdev", "driver=blklogwrites,node-name=logged,log-sector-size=512," +
				"file.driver=file,file.filename=" + img + ",log.driver=file,log.filename=" + logf,
			"-device", "virtio-blk-pci,drive=logged,write-cache=on",
		},
		seen: func() int64 {
			st, err := os.Stat(logf)
			if err != nil {
				return 0
			}
			return st.Size()
		},
	}
	cut := 2*time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
	c := boot(t, g, img, 1, "A", cut, d)
	if !c.Started || !c.Killed {
		t.Fatalf("no outbox acknowledgement before the cut (started %v, killed %v):\n%s", c.Started, c.Killed, tail(c.Serial))
	}
	entries, rest := readLog(t, logf)
	var flushes []int // indexes of flush entries
	for i, e := range entries {
		if e.flags&logFlush != 0 {
			flushes = append(flushes, i)
		}
	}
	if len(flushes) == 0 {
		t.Fatal("the log holds no flush")
	}
	// due(k): the acknowledgements whose flush is at or before entry k.
	due := func(k int) map[string][]string {
		out := map[string][]string{}
		for _, p := range []string{"A", "B"} {
			for _, id := range c.Acks[p] {
				if at, ok := c.Seen[id]; ok && at <= entries[k].end {
					out[p] = append(out[p], id)
				}
			}
		}
		return out
	}
	last := due(flushes[len(flushes)-1])
	t.Logf("cut %.1fs after the first ack: %d writes and flushes logged (%d bytes of torn tail), %d flushes; acknowledged A %d B %d, of which due by the last flush A %d B %d",
		c.After.Seconds(), len(entries), rest, len(flushes), len(c.Acks["A"]), len(c.Acks["B"]), len(last["A"]), len(last["B"]))
	if len(last["A"]) == 0 || len(last["B"]) == 0 {
		t.Fatal("no acknowledgement of A or B is due by the last flush: the replay would prove nothing")
	}
	state := filepath.Join(dir, "state.img")
	work, err := os.OpenFile(filepath.Join(dir, "work.img"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer work.Close()
	if _, err := work.Write(readFile(t, base)); err != nil {
		t.Fatal(err)
	}
	checkState := func(what string, k int, img *os.File) int {
		snapshot(t, img, state)
		out := filepath.Join(t.TempDir(), "data")
		extract(t, state, "/", out)
		want := due(k)
		missing, refused, _ := check(t, out, want)
		for p, ids := range missing {
			t.Logf("%s: path %s lost %d of %d acknowledged records (e.g. %s); refused: %v", what, p, len(ids), len(want[p]), ids[0], refused[p])
		}
		if len(missing) > 0 {
			return 1
		}
		return 0
	}
	const reorderings = 3 // per sampled interval
	var states, reordered int
	began := time.Now()
	next := 0
	for fi, k := range flushes {
		for ; next <= k; next++ {
			apply(t, work, entries[next])
		}
		states++
		violations += checkState(fmt.Sprintf("flush %d (entry %d)", fi+1, k), k, work)
		// A sample of the states between this flush and the next: one
		// interval in four, a few random subsets each.
		if fi+1 < len(flushes) && rng.IntN(4) == 0 {
			between := entries[k+1 : flushes[fi+1]]
			for range reorderings {
				tmp := copyOf(t, work, filepath.Join(dir, "reorder.img"))
				for _, j := range rng.Perm(len(between)) {
					if rng.IntN(2) == 0 {
						apply(t, tmp, between[j])
					}
				}
				states++
				reordered++
				violations += checkState(fmt.Sprintf("writes after flush %d kept at random, out of order", fi+1), k, tmp)
				tmp.Close()
			}
		}
		if violations > 0 {
			break
		}
	}
	t.Logf("%d states checked (%d flush points, %d reorderings between flushes), %d with acknowledged records missing, in %s",
		states, states-reordered, reordered, violations, time.Since(began).Round(time.Second))
	return violations
}

// snapshot copies the image f into path.
func snapshot(t *testing.T, f *os.File, path string) {
	t.Helper()
	dst, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := io.Copy(dst, io.NewSectionReader(f, 0, 1<<40)); err != nil {
		t.Fatal(err)
	}
}

// copyOf copies f into a new file at path and returns it open.
func copyOf(t *testing.T, f *os.File, path string) *os.File {
	t.Helper()
	snapshot(t, f, path)
	out, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
