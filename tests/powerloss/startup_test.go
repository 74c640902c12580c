package powerloss

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
)

// Paths F and G: cuts in start-ups that rewrite a file. The host prepares
// one disk with the project's own code, and every cut boots a fresh copy
// of it, so each cut falls in the same start-up:
//
//	F  /data/f-compact.db: an outbox whose free pages are most of the file
//	   (many large records appended, most removed), so its first open
//	   compacts it (internal/boltfile/compact.go: copy to .compact, fsync,
//	   rename, directory fsync).
//	G  /data/f-upgrade.db: an outbox written before checksums (every
//	   record in the old format, no "checksums" mark) over several upgrade
//	   transactions, one of its records unreadable, so its first open
//	   upgrades every record and moves the unreadable one to the
//	   outbox/damaged bucket (internal/outbox/damaged.go).
//
// Both processes then append new records (broker unreachable) and print
// "F-..." / "G-..." for each, so a path's first line marks the end of its
// start-up. After each cut the file must open whole with the binary's
// code (verified) or be refused with a clear message, and hold every
// record it was prepared with and every acknowledged one.
func init() {
	configs["cfg/f.yaml"] = outboxConfig("F", "", "tcp://127.0.0.1:1", "", "powerloss/f", "/data/"+compactFile)
	configs["cfg/g.yaml"] = outboxConfig("G", "", "tcp://127.0.0.1:1", "", "powerloss/g", "/data/"+upgradeFile)
}

const (
	compactFile = "f-compact.db"
	upgradeFile = "f-upgrade.db"

	compactRecords = 5000
	compactKept    = 500     // the last ones; the rest removed
	compactPayload = 8 << 10 // 5000 x 8 KiB: ~40 MiB, ~36 MiB of it free after the removals
	upgradeRecords = 25000   // three upgrade transactions (upgradeBatch 10000)
	upgradeBad     = 7       // the seq made unreadable
)

// prepared is what the host wrote into the template disk.
type prepared struct {
	compact, upgrade []string // the event IDs each file must keep
	compactSize      int64
}

// prepareStartupDisk writes the two files with the outbox's own code (the
// old format: the current one without its checksum trailer, version byte
// 1, no checksums mark) and copies them into a fresh ext4 image.
func prepareStartupDisk(t *testing.T, img string) prepared {
	t.Helper()
	dir := t.TempDir()
	var p prepared
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	appendAll := func(path, prefix string, n, size int) []outbox.Record {
		o, err := outbox.Open(path, outbox.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		var recs []outbox.Record
		for i := 0; i < n; i += 1000 {
			var es []outbox.Entry
			for j := i; j < min(n, i+1000); j++ {
				es = append(es, outbox.Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("%s-%d", prefix, j), Topic: "powerloss/prepared", Payload: []byte(strings.Repeat("p", size))}})
			}
			rs, errs := o.AppendBatch(ctx, es)
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			recs = append(recs, rs...)
		}
		if prefix == "P" {
			var seqs []uint64
			for _, r := range recs[:n-compactKept] {
				seqs = append(seqs, r.Seq)
			}
			if err := o.Remove(seqs...); err != nil {
				t.Fatal(err)
			}
		}
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
		return recs
	}
	cpath := filepath.Join(dir, compactFile)
	for _, r := range appendAll(cpath, "P", compactRecords, compactPayload)[compactRecords-compactKept:] {
		p.compact = append(p.compact, r.EventID)
	}
	fi, err := os.Stat(cpath)
	if err != nil {
		t.Fatal(err)
	}
	p.compactSize = fi.Size()

	upath := filepath.Join(dir, upgradeFile)
	for _, r := range appendAll(upath, "U", upgradeRecords, 64) {
		if r.Seq != upgradeBad {
			p.upgrade = append(p.upgrade, r.EventID)
		}
	}
	db, err := bolt.Open(upath, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		records := tx.Bucket([]byte("outbox/records"))
		old := map[string][]byte{}
		if err := records.ForEach(func(k, v []byte) error {
			o := append([]byte(nil), v[:len(v)-4]...) // the checksum trailer
			o[0] = 1                                  // the version before checksums
			old[string(k)] = o
			return nil
		}); err != nil {
			return err
		}
		for k, v := range old {
			if seqFromKey([]byte(k)) == upgradeBad {
				v = []byte{1, 1, 2} // too short to decode
			}
			if err := records.Put([]byte(k), v); err != nil {
				return err
			}
		}
		return tx.Bucket([]byte("outbox/meta")).Delete([]byte("checksums"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	disk(t, img, 192)
	for _, f := range []string{compactFile, upgradeFile} {
		run(t, "", 2*time.Minute, "debugfs", "-w", "-R", fmt.Sprintf("write %s %s", filepath.Join(dir, f), f), img)
	}
	return p
}

func seqFromKey(k []byte) uint64 {
	var n uint64
	for _, b := range k {
		n = n<<8 | uint64(b)
	}
	return n
}

// upgradeState reads, without changing it, how far the upgrade got.
type upgradeState struct {
	marked  bool // the checksums mark is set: the upgrade finished
	old     int  // records still in the old format
	damaged int  // records in outbox/damaged
}

func readUpgradeState(path string) (upgradeState, error) {
	var st upgradeState
	db, err := boltfile.OpenReadOnly(path, 5*time.Second)
	if err != nil {
		return st, err
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		meta, records := tx.Bucket([]byte("outbox/meta")), tx.Bucket([]byte("outbox/records"))
		if meta == nil || records == nil {
			return fmt.Errorf("%s: outbox buckets missing", path)
		}
		st.marked = meta.Get([]byte("checksums")) != nil
		if b := tx.Bucket([]byte("outbox/damaged")); b != nil {
			st.damaged = b.Stats().KeyN
		}
		return records.ForEach(func(_, v []byte) error {
			if len(v) > 0 && v[0] == 1 {
				st.old++
			}
			return nil
		})
	})
	return st, err
}

// startupTally counts the phases the cuts fell in.
type startupTally struct {
	inStartF, inStartG             int // cuts before the path's first acknowledgement
	beforeRename, afterRename      int // F: the file on disk is the sparse original / the copy
	notBegun, midway, done         int // G: upgrade transactions committed at the cut
	ackedF, ackedG, lost, refusals int
}

// checkStartup checks one cut's disk and counts its phase.
func checkStartup(t *testing.T, i int, dir string, p prepared, acked map[string][]string, tl *startupTally) {
	cpath, upath := filepath.Join(dir, compactFile), filepath.Join(dir, upgradeFile)
	if fi, err := os.Stat(cpath); err == nil && fi.Size() >= p.compactSize {
		tl.beforeRename++
	} else if err == nil {
		tl.afterRename++
	}
	us, err := readUpgradeState(upath)
	switch {
	case err != nil:
		tl.refusals++
		t.Errorf("cut %d: %s cannot be read after the cut: %v", i, upgradeFile, err)
	case us.marked:
		tl.done++
	case us.old == upgradeRecords:
		tl.notBegun++
	default:
		tl.midway++
	}
	for _, c := range []struct {
		path string
		want []string
	}{{cpath, append(p.compact, acked["F"]...)}, {upath, append(p.upgrade, acked["G"]...)}} {
		f := readOutbox(t, c.path)
		if f.refused != nil {
			tl.refusals++
			t.Errorf("cut %d: %s refused after a cut in its start-up: %v", i, filepath.Base(c.path), f.refused)
			continue
		}
		var missing []string
		for _, id := range c.want {
			if !f.ids[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			tl.lost += len(missing)
			t.Errorf("cut %d: %s lost %d of its %d records, e.g. %q", i, filepath.Base(c.path), len(missing), len(c.want), missing[0])
		}
	}
	// readOutbox's open finished the upgrade if the cut stopped it: the
	// unreadable record is in outbox/damaged, once.
	if after, err := readUpgradeState(upath); err == nil && (!after.marked || after.damaged != 1 || after.old != 0) {
		t.Errorf("cut %d: after an open, %s has mark %v, %d old-format records, %d damaged (want true, 0, 1)", i, upgradeFile, after.marked, after.old, after.damaged)
	}
}

// TestStartUpRewritesSurvivePowerCuts cuts the power during the start-up
// of an outbox that is compacted at open and of one that is upgraded to
// checksums (moving its unreadable record aside), each cut on a fresh copy
// of the prepared disk, at a random moment within the start-up's length
// measured by a first boot, narrowed towards the rewrites as cuts land
// before or after them.
func TestStartUpRewritesSurvivePowerCuts(t *testing.T) {
	rng := testRand(t, 3)
	g := newGuest(t, "", "f g")
	template := filepath.Join(t.TempDir(), "template.img")
	p := prepareStartupDisk(t, template)
	n := cuts(t, 10)
	if n > 10 {
		n = 10 // the outbox's steady paths take the large counts
	}
	fresh := func() string {
		img := filepath.Join(t.TempDir(), "disk.img")
		run(t, "", 2*time.Minute, "cp", "--sparse=always", template, img)
		return img
	}
	began := time.Now()
	var tl startupTally
	// The measuring boot: until both paths acknowledged a record.
	img := fresh()
	c := boot(t, g, img, 0, "", 6*time.Minute, &drive{until: func(a map[string][]string) bool { return len(a["F"]) > 0 && len(a["G"]) > 0 }})
	if !c.Killed || len(c.Acks["F"]) == 0 || len(c.Acks["G"]) == 0 {
		t.Fatalf("the measuring boot did not finish both start-ups:\n%s", tail(c.Serial))
	}
	startup := c.After
	dir := filepath.Join(t.TempDir(), "data")
	extract(t, img, "/", dir)
	if fi, err := os.Stat(filepath.Join(dir, compactFile)); err != nil || fi.Size() >= p.compactSize {
		t.Fatalf("the measuring boot did not compact %s (%v): the scenario does not exercise compaction", compactFile, err)
	}
	if us, err := readUpgradeState(filepath.Join(dir, upgradeFile)); err != nil || !us.marked || us.damaged != 1 {
		t.Fatalf("the measuring boot did not upgrade %s (%+v, %v): the scenario does not exercise the upgrade", upgradeFile, us, err)
	}
	t.Logf("measuring boot: both start-ups done %.1fs after the scenario started (boot %.1fs)", startup.Seconds(), c.BootTook.Seconds())
	lo, hi := time.Duration(0), startup
	for i := 1; i <= n; i++ {
		before, notBegun := tl.beforeRename, tl.notBegun
		img := fresh()
		cut := lo + time.Duration(rng.Int64N(int64(hi-lo)))
		c := boot(t, g, img, i, "", cut, nil)
		if !c.Started || !c.Killed {
			t.Fatalf("cycle %d: the guest did not run its scenario until the cut (started %v, killed %v):\n%s", i, c.Started, c.Killed, tail(c.Serial))
		}
		if len(c.Acks["F"]) == 0 {
			tl.inStartF++
		}
		if len(c.Acks["G"]) == 0 {
			tl.inStartG++
		}
		tl.ackedF += len(c.Acks["F"])
		tl.ackedG += len(c.Acks["G"])
		dir := filepath.Join(t.TempDir(), "data")
		extract(t, img, "/", dir)
		lost := tl.lost
		checkStartup(t, i, dir, p, c.Acks, &tl)
		t.Logf("cut %d/%d %.1fs after the start (drawn from %.1f-%.1fs): acknowledged F %d G %d; lost %d; so far F before/after the rename %d/%d, G upgrade not begun/midway/done %d/%d/%d",
			i, n, c.After.Seconds(), lo.Seconds(), hi.Seconds(), len(c.Acks["F"]), len(c.Acks["G"]), tl.lost-lost, tl.beforeRename, tl.afterRename, tl.notBegun, tl.midway, tl.done)
		// Narrow the window to the rewrites: a cut after both start-ups
		// lowers its end, one before either file was touched raises its
		// start (the start-up's length varies with the host's load, so
		// the window is kept at least 3 s wide).
		switch {
		case len(c.Acks["F"]) > 0 && len(c.Acks["G"]) > 0:
			hi = cut
		case tl.beforeRename > before && tl.notBegun > notBegun:
			lo = cut
		}
		if hi-lo < 3*time.Second {
			lo, hi = max(0, lo-time.Second), hi+2*time.Second
		}
		if t.Failed() {
			t.Logf("serial of cut %d:\n%s", i, tail(c.Serial))
			break
		}
	}
	t.Logf("paths F and G: %d cuts (%d in F's start-up, %d in G's); F: %d prepared + %d acknowledged records, %d cuts before the rename, %d after; G: %d prepared + %d acknowledged, upgrade not begun %d, midway %d, done %d; %d lost, %d refusals; %s in all",
		n, tl.inStartF, tl.inStartG, len(p.compact), tl.ackedF, tl.beforeRename, tl.afterRename, len(p.upgrade), tl.ackedG, tl.notBegun, tl.midway, tl.done, tl.lost, tl.refusals, time.Since(began).Round(time.Second))
	if tl.inStartF == 0 || tl.inStartG == 0 {
		t.Errorf("no cut fell in a start-up (F %d, G %d): the run proves nothing about them", tl.inStartF, tl.inStartG)
	}
}
