// Package powerloss cuts the power of a machine running reliable-mqtt and
// looks for every acknowledged record on its disk (issue 26).
//
// A qemu guest (guest_test.go) runs the static binary on an ext4 disk
// image; qemu is SIGKILLed at a random moment; the image's journal is
// replayed as the next mount would and the files are read with the
// project's own code (internal/outbox, internal/ledger, the SQL ledger's
// SQLite driver). Each process in the guest prints a line for a message
// only after the step under test acknowledged it, so every printed line is
// a promise the disk must keep.
//
// The control run boots a binary built with the powerloss_nosync tag
// (bbolt without fsync, internal/boltfile/nosync.go) and must lose
// acknowledged records on every cut: the suite proves it can see a loss.
//
// relay_test.go adds path E (removal after confirmation, the embedded
// broker's store) to the same boots; startup_test.go cuts the start-ups
// that compact an outbox and upgrade an old one (paths F and G);
// packed_test.go cuts a packed chain on a guest of its own (path P).
//
// Run alone (longer than go test's default 10 minute timeout):
//
//	go test -count=1 -v -timeout 60m ./tests/powerloss/
//
// POWERLOSS_SEED replays the cut times of a logged run; POWERLOSS_CUTS sets
// the number of cuts of the main run.
package powerloss

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	_ "github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger" // the SQLite driver the binary uses
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// SeedEnv replays a run: POWERLOSS_SEED=<the seed it logged>.
const SeedEnv = "POWERLOSS_SEED"

func testRand(t *testing.T, stream uint64) *rand.Rand { return harness.Rand(t, SeedEnv, stream) }

func cuts(t *testing.T, def int) int { return harness.EnvCount(t, "POWERLOSS_CUTS", def) }

// The scenario: three processes at once, one per durable path, each on its
// own file on the guest's disk. A line "X <cycle>-<n>" is printed only
// after X's step acknowledged message n:
//
//	A  outbox append: generate -> fan_out_sequential [reliable_mqtt_out
//	   (broker unreachable: records stay pending), stdout]. stdout runs only
//	   after the outbox's Write returned, i.e. after the fsync'd commit.
//	B  bbolt dedup_ledger, commit: immediate: the key is committed in the
//	   processor, before the line.
//	C  SQLite dedup_ledger with apply: the ledger row and an effect row
//	   commit in one transaction, before the line.
//	D  the outbox and a bbolt dedup_ledger (commit: immediate) sharing one
//	   file, as config/ledger_relay.yaml does: the key, then the record,
//	   then the line.
var configs = map[string]string{
	"cfg/a.yaml": outboxConfig("A", "", "tcp://127.0.0.1:1", "", "powerloss/a", "/data/outbox.db"),
	"cfg/b.yaml": idSource("B") + `pipeline:
  processors:
    - dedup_ledger: { path: /data/ledger.db, commit: immediate }
    - mapping: 'root = content().string() + "\n"'
output:
  stdout: { codec: all-bytes }
`,
	"cfg/c.yaml": idSource("C") + `pipeline:
  processors:
    - dedup_ledger:
        sql:
          driver: sqlite
          dsn: /data/sql.db
          init_statements: [ "CREATE TABLE IF NOT EXISTS effects (id TEXT PRIMARY KEY)" ]
          apply:
            - query: INSERT INTO effects (id) VALUES (?)
              args_mapping: root = [ meta("event_id") ]
    - mapping: 'root = content().string() + "\n"'
output:
  stdout: { codec: all-bytes }
`,
	"cfg/d.yaml": idSource("D") + `pipeline:
  processors:
    - dedup_ledger: { path: /data/relay.db, commit: immediate }
` + outboxThenStdout("tcp://127.0.0.1:1", "", "powerloss/d", "/data/relay.db"),
}

// idSource starts paths B, C and D: generate as fast as it goes, each
// message "<prefix>-<cycle>-<n>" with that as its event_id.
func idSource(prefix string) string {
	return fmt.Sprintf(`
http: {enabled: false}
logger: {level: WARN}
input:
  generate:
    interval: ""
    mapping: |
      let id = "%s-" + env("CYCLE") + "-" + counter().string()
      root = $id
      meta event_id = $id
`, prefix)
}

// outboxConfig is path A's pipeline: generate (every interval; "" as
// fast as it goes) -> outboxThenStdout, printing "<prefix>-<cycle>-<n>"
// once the outbox holds the record.
func outboxConfig(prefix, interval, url, clientID, topic, path string) string {
	return fmt.Sprintf(`
http: {enabled: false}
logger: {level: WARN}
input:
  generate:
    interval: "%s"
    mapping: 'root = "%s-" + env("CYCLE") + "-" + counter().string()'
`, interval, prefix) + outboxThenStdout(url, clientID, topic, path)
}

// outboxThenStdout is the output of paths A and D: fan_out_sequential
// [reliable_mqtt_out to url with topic and the outbox at path (clientID ""
// leaves its default), stdout], so a message's line is printed only once
// the outbox holds its record.
func outboxThenStdout(url, clientID, topic, path string) string {
	id := ""
	if clientID != "" {
		id = "\n          client_id: " + clientID
	}
	return fmt.Sprintf(`output:
  broker:
    pattern: fan_out_sequential
    outputs:
      - reliable_mqtt_out:
          urls: [ "%s" ]%s
          topic: %s
          event_id: '${! content() }'
          outbox: { path: %s }
      - stdout: { codec: all-bytes }
        processors: [ { mapping: 'root = content().string() + "\n"' } ]
`, url, id, topic, path)
}

// The processes print their acknowledgements on a serial port of their
// own (ttyS1, a file on the host), each line in one write (the line ends
// in the message itself, codec all-bytes), so lines of two processes never
// interleave; logs go to the console (ttyS0).
// A process named in commands runs that command instead of
// reliable-mqtt -c /cfg/<name>.yaml.
func scenario(procs string) string {
	var b strings.Builder
	for _, p := range strings.Fields(procs) {
		cmd, ok := commands[p]
		if !ok {
			cmd = "reliable-mqtt -c /cfg/" + p + ".yaml"
		}
		b.WriteString(cmd + " >/dev/ttyS1 2>/dev/console &\n")
	}
	return b.String() + "wait\n"
}

// paths name the scenario's paths.
var paths = []string{"A", "B", "C", "D"}

// ackLine is "X-<cycle>-<n>", or "R:X-<cycle>-<n>" for a message a
// consumer received (relay_test.go).
var ackLine = regexp.MustCompile(`^(R:)?(([A-Z])-\d+-\d+)$`)

// acks returns the acknowledged IDs printed on the acknowledgement port,
// by path ("R:X" for path X's receipts): whole lines only (the last,
// without its newline, was cut short).
func acks(serial string) map[string][]string {
	out := map[string][]string{}
	lines := strings.Split(serial, "\n")
	for _, l := range lines[:len(lines)-1] {
		if m := ackLine.FindStringSubmatch(strings.Trim(l, "\r")); m != nil {
			out[m[1]+m[3]] = append(out[m[1]+m[3]], m[2])
		}
	}
	return out
}

// guest is the image and initramfs of one binary.
type guest struct {
	kernel, initrd string
}

// newGuest builds the initramfs of the binary built with tags, running the
// processes procs ("a b c d": the configs' names) at once.
func newGuest(t *testing.T, tags, procs string) guest {
	t.Helper()
	for _, tool := range []string{"qemu-system-x86_64", "e2fsck", "debugfs", "mkfs.ext4", "apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (tests/run installs qemu-system-x86 and e2fsprogs): %v", tool, err)
		}
	}
	kernel, modules, busybox := debs(t)
	bin := staticBinary(t, tags)
	files := map[string][]byte{"init": initScript(scenario(procs))}
	for n, c := range configs {
		files[n] = []byte(c)
	}
	initrd := filepath.Join(t.TempDir(), "initrd.cpio")
	initramfs(t, initrd, busybox, modules, bin, files)
	return guest{kernel: kernel, initrd: initrd}
}

// found is what one path's file holds after a cut.
type found struct {
	refused error           // the file was refused (or is missing)
	ids     map[string]bool // acknowledged-able IDs present
	effects map[string]bool // C: effect rows; D: outbox records
}

// readOutbox opens the outbox with the binary's code (verify always, as
// the start after the cut would at this size) and lists its event IDs.
func readOutbox(t *testing.T, path string) found {
	if _, err := os.Stat(path); err != nil {
		return found{refused: err}
	}
	o, err := outbox.Open(path, outbox.Options{Verify: boltfile.VerifyAlways})
	if err != nil {
		return found{refused: err}
	}
	defer o.Close()
	f := found{ids: map[string]bool{}}
	var after uint64
	for {
		recs, err := o.Read(after, 4096)
		if err != nil {
			return found{refused: err}
		}
		if len(recs) == 0 {
			return f
		}
		for _, r := range recs {
			f.ids[r.EventID] = true
			after = r.Seq
		}
	}
}

// readLedger opens the bbolt ledger as a start would, then reports which
// of keys it holds.
func readLedger(t *testing.T, path string, keys []string) found {
	if _, err := os.Stat(path); err != nil {
		return found{refused: err}
	}
	l, err := ledger.Open(path, ledger.Options{Verify: boltfile.VerifyAlways})
	if err != nil {
		return found{refused: err}
	}
	if err := l.Close(); err != nil {
		return found{refused: err}
	}
	db, err := boltfile.OpenReadOnly(path, 5*time.Second)
	if err != nil {
		return found{refused: err}
	}
	defer db.Close()
	f := found{ids: map[string]bool{}}
	err = db.View(func(tx *bolt.Tx) error {
		if _, err := ledger.Check(tx, path); err != nil {
			return err
		}
		for _, k := range keys {
			e, err := ledger.LookupIn(tx, path, claims.Key{ID: k})
			if err != nil {
				return err
			}
			f.ids[k] = e.Applied
		}
		return nil
	})
	if err != nil {
		return found{refused: err}
	}
	return f
}

// readRelay reads the shared file: the outbox's records (effects) and
// which of keys and of the records' IDs the ledger holds (ids).
func readRelay(t *testing.T, path string, keys []string) found {
	o := readOutbox(t, path)
	if o.refused != nil {
		return o
	}
	all := slices.Clone(keys)
	for id := range o.ids {
		all = append(all, id)
	}
	l := readLedger(t, path, all)
	if l.refused != nil {
		return l
	}
	return found{ids: l.ids, effects: o.ids}
}

// readSQL reads the SQLite ledger's rows and the effect rows.
func readSQL(t *testing.T, path string) found {
	if _, err := os.Stat(path); err != nil {
		return found{refused: err}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return found{refused: err}
	}
	defer db.Close()
	f := found{ids: map[string]bool{}, effects: map[string]bool{}}
	var check string
	if err := db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		return found{refused: fmt.Errorf("integrity_check: %q, %v", check, err)}
	}
	for q, into := range map[string]map[string]bool{"SELECT key FROM dedup_ledger": f.ids, "SELECT id FROM effects": f.effects} {
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			return found{refused: err}
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				rows.Close()
				return found{refused: err}
			}
			into[s] = true
		}
		rows.Close()
	}
	return f
}

// tally counts one path over a run.
type tally struct {
	acked, lost, refused int
}

// check compares what the cut left in dir with everything acknowledged so
// far (acked, by path letter) and returns, per path, the acknowledged IDs
// missing and a refusal; for C also the IDs with an effect but no ledger
// row or the reverse.
func check(t *testing.T, dir string, acked map[string][]string) (missing map[string][]string, refused map[string]error, split []string) {
	missing, refused = map[string][]string{}, map[string]error{}
	got := map[string]found{
		"A": readOutbox(t, filepath.Join(dir, "outbox.db")),
		"B": readLedger(t, filepath.Join(dir, "ledger.db"), acked["B"]),
		"C": readSQL(t, filepath.Join(dir, "sql.db")),
		"D": readRelay(t, filepath.Join(dir, "relay.db"), acked["D"]),
	}
	for p, f := range got {
		if f.refused != nil {
			if len(acked[p]) > 0 {
				refused[p] = f.refused
				missing[p] = acked[p]
			}
			continue
		}
		for _, id := range acked[p] {
			if !f.ids[id] {
				missing[p] = append(missing[p], id)
			}
		}
	}
	if d := got["D"]; d.refused == nil {
		for _, id := range acked["D"] {
			if d.ids[id] && !d.effects[id] {
				missing["D"] = append(missing["D"], id+" (ledger key without its outbox record)")
			}
		}
		for id := range d.effects {
			if !d.ids[id] {
				split = append(split, id+" (outbox record, no ledger key)")
			}
		}
	}
	if c := got["C"]; c.refused == nil {
		for id := range c.ids {
			if !c.effects[id] {
				split = append(split, id+" (ledger row, no effect)")
			}
		}
		for id := range c.effects {
			if !c.ids[id] {
				split = append(split, id+" (effect, no ledger row)")
			}
		}
	}
	return missing, refused, split
}

// TestAcknowledgedRecordsSurvivePowerCuts cuts the guest's power at random
// moments, on one disk that every boot reopens (so a cut can fall in the
// start-up of existing files as well as in their creation and in steady
// appends), and after every cut looks for every record acknowledged in any
// boot so far.
func TestAcknowledgedRecordsSurvivePowerCuts(t *testing.T) {
	rng := testRand(t, 1)
	g := newGuest(t, "", "a b c d e-pub e-sub-late")
	drain := newGuest(t, "", "e-mark e-sub")
	img := filepath.Join(t.TempDir(), "disk.img")
	disk(t, img, 128)
	relaySetup(t, drain, img)
	n := cuts(t, 20)
	acked := map[string][]string{}
	tallies := map[string]*tally{"A": {}, "B": {}, "C": {}, "D": {}}
	var relay relayTally
	brokerOnly := map[string]bool{}
	startup := 0
	began := time.Now()
	for i := 1; i <= n; i++ {
		// Timed from path E's first receipt (the last to start: its
		// subscriber starts 8 s late), while all five write, or from the
		// start.
		c, mark := randomCut(t, rng, g, img, i, "R:E")
		now := c.Acks
		if mark == "" {
			startup++
		}
		for p, ids := range now {
			acked[p] = append(acked[p], ids...)
			if tl, ok := tallies[p]; ok {
				tl.acked += len(ids)
			}
		}
		dir := filepath.Join(t.TempDir(), "data")
		extract(t, img, "/", dir)
		missing, refused, split := check(t, dir, acked)
		relay.acked += len(now["E"])
		lostE := relay.lost
		e := checkRelayE(t, i, dir, acked["E"], &relay, brokerOnly)
		t.Logf("cut %d/%d %.1fs after %s (boot %.1fs): acknowledged now A %d B %d C %d D %d E %d (received %d); missing A %d B %d C %d D %d E %d; E in outbox %d, broker %d, received %d",
			i, n, c.After.Seconds(), map[string]string{"": "the start", "R:E": "E's first receipt"}[mark], c.BootTook.Seconds(),
			len(now["A"]), len(now["B"]), len(now["C"]), len(now["D"]), len(now["E"]), len(now["R:E"]),
			len(missing["A"]), len(missing["B"]), len(missing["C"]), len(missing["D"]), relay.lost-lostE,
			len(e.outbox), len(e.broker), len(e.received))
		for p, err := range refused {
			tallies[p].refused++
			t.Errorf("cut %d: path %s's file refused after a cut with %d acknowledged records: %v", i, p, len(acked[p]), err)
		}
		for p, ids := range missing {
			tallies[p].lost += len(ids)
			t.Errorf("cut %d: path %s lost %d acknowledged records, e.g. %q", i, p, len(ids), ids[0])
		}
		if len(split) > 0 {
			t.Errorf("cut %d: %d effects without their ledger row or the reverse, e.g. %s", i, len(split), split[0])
		}
		if t.Failed() {
			t.Logf("serial of cut %d:\n%s", i, tail(c.Serial))
			break
		}
	}
	if !t.Failed() {
		relayDrain(t, drain, img, n+1, acked["E"], &relay, brokerOnly)
	}
	for _, p := range paths {
		tl := tallies[p]
		t.Logf("path %s: %d cuts, %d acknowledged, %d lost, %d refusals", p, n, tl.acked, tl.lost, tl.refused)
		if tl.acked == 0 {
			t.Errorf("path %s acknowledged nothing in %d boots: the run proves nothing about it", p, n)
		}
	}
	t.Logf("path E: %d cuts, %d acknowledged, %d lost, %d refusals; at the cuts %d confirmed records held only by the broker's store (%d distinct, %d of them delivered after), %d duplicates (received and back in the outbox)",
		n, relay.acked, relay.lost, relay.refused, relay.brokerOnly, len(brokerOnly), relay.deliveredAfter, relay.duplicates)
	if relay.acked == 0 || len(brokerOnly) == 0 {
		t.Errorf("path E: %d acknowledged, %d confirmed records held only by the broker at a cut: the run proves nothing about removal or the broker's store", relay.acked, len(brokerOnly))
	}
	t.Logf("%d cuts timed from the scenario's start (start-up), %d from path E's first receipt; %s in all", startup, n-startup, time.Since(began).Round(time.Second))
}

// randomCut boots g on img as cycle i and cuts its power: one cut in four
// in the first 8 s after the scenario starts (the processes' start-up:
// files opened, created or recovered), the rest within 6 s of the boot's
// first acknowledgement of path receipt. It returns the cycle and its
// mark ("" for the start, else receipt).
func randomCut(t *testing.T, rng *rand.Rand, g guest, img string, i int, receipt string) (cycle, string) {
	t.Helper()
	mark, cut := receipt, 300*time.Millisecond+time.Duration(rng.Int64N(int64(6*time.Second)))
	if rng.IntN(4) == 0 {
		mark, cut = "", time.Duration(rng.Int64N(int64(8*time.Second)))
	}
	c := boot(t, g, img, i, mark, cut, nil)
	if !c.Started || !c.Killed {
		t.Fatalf("cycle %d: the guest did not run its scenario until the cut (started %v, killed %v):\n%s", i, c.Started, c.Killed, tail(c.Serial))
	}
	return c, mark
}

// TestNoSyncControlLosesAcknowledgedRecords runs the same scenario with a
// binary whose bbolt files are never fsync'd (build tag powerloss_nosync):
// every cut, on a fresh disk, must lose acknowledged outbox or ledger
// records, or the suite could not see a loss.
func TestNoSyncControlLosesAcknowledgedRecords(t *testing.T) {
	rng := testRand(t, 2)
	g := newGuest(t, "powerloss_nosync", "a b d")
	n := cuts(t, 5)
	if n > 5 {
		n = 5
	}
	failed := 0
	for i := 1; i <= n; i++ {
		img := filepath.Join(t.TempDir(), "disk.img")
		disk(t, img, 128)
		// After the first outbox acknowledgement, so there is a promise to break.
		cut := time.Second + time.Duration(rng.Int64N(int64(5*time.Second)))
		c := boot(t, g, img, i, "A", cut, nil)
		if !c.Started || !c.Killed {
			t.Fatalf("control cycle %d: no outbox acknowledgement before the cut (started %v, killed %v):\n%s", i, c.Started, c.Killed, tail(c.Serial))
		}
		acked := c.Acks
		delete(acked, "C") // SQLite syncs on its own: not part of the control
		dir := filepath.Join(t.TempDir(), "data")
		extract(t, img, "/", dir)
		missing, refused, _ := check(t, dir, acked)
		lost := len(missing["A"]) + len(missing["B"]) + len(missing["D"])
		t.Logf("control cut %d/%d %.1fs after the first ack: acknowledged A %d B %d D %d; missing A %d B %d D %d; refused %d files",
			i, n, c.After.Seconds(), len(acked["A"]), len(acked["B"]), len(acked["D"]), len(missing["A"]), len(missing["B"]), len(missing["D"]), len(refused))
		if lost > 0 {
			failed++
		}
	}
	t.Logf("control: %d of %d cuts failed the check", failed, n)
	if failed != n {
		t.Fatalf("the no-sync control failed the check on %d of %d cuts, want all: the suite cannot see a missing fsync", failed, n)
	}
}

func tail(s string) string {
	const max = 4000
	if len(s) > max {
		return "..." + s[len(s)-max:]
	}
	return s
}
