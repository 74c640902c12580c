package powerloss

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// Path P: a packed chain. Two processes on one disk:
//
//	p-pub  generate (128 readings a second, in batches of 32: more
//	       than p-sub, which takes 15 ms a reading, can apply, so
//	       frames queue however fast the machine) ->
//	       [reliable_mqtt_out (outbox /data/p-outbox.db, confirm:
//	       end_to_end, pack.max_events 64), stdout]: "P-<cycle>-<n>" once
//	       the record is in the outbox. It runs the embedded broker
//	       (/data/p-broker, 127.0.0.1:1885); the sender packs what waits
//	       into frames and removes a frame's records at the frame's ACK.
//	p-sub  reliable_mqtt_in (envelope: ingress, ack_topic) -> SQLite
//	       dedup_ledger whose apply inserts a row (id, frame_id) into
//	       effects, in the ledger's transaction -> stdout "R:P-<cycle>-<n>".
//	       A frame arrives as one batch; its ACK goes after every event's
//	       commit.
//
// effects has no key of its own: an event applied twice is two rows.
// After every cut, each acknowledged reading is still in the outbox or
// applied, each receipt is applied, no event has two effect rows, and
// ledger rows and effects agree. A last boot without a cut applies every
// acknowledged reading, each once.
func init() {
	configs["cfg/p-pub.yaml"] = packedPublisher(`
    interval: 250ms
    batch_size: 32
    mapping: |
      let id = "P-" + env("CYCLE") + "-" + counter().string()
      root = {"id": $id}
      meta event_id = $id`)
	// The drain boot's publisher adds nothing: it sends what its outbox
	// holds.
	configs["cfg/p-drain.yaml"] = packedPublisher(`
    interval: 1s
    mapping: root = deleted()`)
	configs["cfg/p-sub.yaml"] = packedSubscriber("\n    - sleep: { duration: 15ms } # per reading: at most ~66 a second, below p-pub's 128")
	// The drain boot's subscriber (the same session) applies at full speed.
	configs["cfg/p-drain-sub.yaml"] = packedSubscriber("")
}

// packedSubscriber is p-sub with first, a processor, ahead of the ledger.
func packedSubscriber(first string) string {
	return `
http: {enabled: false}
logger: {level: WARN}
input:
  reliable_mqtt_in:
    urls: [ "tcp://127.0.0.1:1885" ]
    client_id: powerloss-p-sub
    topics: [ powerloss/p ]
    qos: 1
    envelope: ingress
    ack_topic: powerloss/p-acks
pipeline:
  processors:` + first + `
    - dedup_ledger:
        sql:
          driver: sqlite
          dsn: /data/p-sql.db
          init_statements: [ "CREATE TABLE IF NOT EXISTS effects (id TEXT NOT NULL, frame TEXT NOT NULL)" ]
          apply:
            - query: INSERT INTO effects (id, frame) VALUES (?, ?)
              args_mapping: root = [ meta("event_id"), meta("frame_id").or("") ]
    - mapping: 'root = "R:" + this.id + "\n"'
output:
  stdout: { codec: all-bytes }
`
}

// packedPublisher is p-pub with the generate input's fields gen.
func packedPublisher(gen string) string {
	return `
http: {enabled: false}
logger: {level: WARN}
input:
  generate:` + gen + `
output:
  broker:
    pattern: fan_out_sequential
    outputs:
      - reliable_mqtt_out:
          urls: [ "embedded://?dir=/data/p-broker&listen=127.0.0.1:1885" ]
          client_id: powerloss-p-pub
          topic: powerloss/p-dest
          event_id: '${! meta("event_id") }'
          confirm: end_to_end
          data_topic: powerloss/p
          ack_topic: powerloss/p-acks
          pack: { max_events: 64 }
          outbox: { path: /data/p-outbox.db }
      - stdout: { codec: all-bytes }
        processors: [ { mapping: 'root = this.id + "\n"' } ]
`
}

// packedState is what a cut left of path P: the outbox's records, the
// ledger's keys, and each applied event's effect rows (their frame IDs,
// "" for an event that came alone).
type packedState struct {
	outbox, keys map[string]bool
	effects      map[string][]string
}

// readPacked reads path P's outbox with the binary's code and its SQLite
// file after an integrity check; a file not created yet is empty.
func readPacked(t *testing.T, dir string) (packedState, error) {
	st := packedState{outbox: map[string]bool{}, keys: map[string]bool{}, effects: map[string][]string{}}
	if p := filepath.Join(dir, "p-outbox.db"); exists(p) {
		f := readOutbox(t, p)
		if f.refused != nil {
			return st, f.refused
		}
		st.outbox = f.ids
	}
	p := filepath.Join(dir, "p-sql.db")
	if !exists(p) {
		return st, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := sql.Open("sqlite", p)
	if err != nil {
		return st, err
	}
	defer db.Close()
	var check string
	if err := db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		return st, fmt.Errorf("%s: integrity_check: %q, %v", p, check, err)
	}
	// A cut in the ledger's first start can leave a table not created
	// yet: it then holds nothing.
	tables := map[string]bool{}
	if err := rowsOf(ctx, db, "SELECT name, '' FROM sqlite_master WHERE type = 'table'", func(name, _ string) { tables[name] = true }); err != nil {
		return st, fmt.Errorf("%s: %w", p, err)
	}
	for _, r := range []struct {
		table, query string
		row          func(id, frame string)
	}{
		{"dedup_ledger", "SELECT key, '' FROM dedup_ledger", func(id, _ string) { st.keys[id] = true }},
		{"effects", "SELECT id, frame FROM effects", func(id, frame string) { st.effects[id] = append(st.effects[id], frame) }},
	} {
		if !tables[r.table] {
			continue
		}
		if err := rowsOf(ctx, db, r.query, r.row); err != nil {
			return st, fmt.Errorf("%s: %w", p, err)
		}
	}
	return st, nil
}

// rowsOf runs q, whose rows are two strings, and hands each row to row.
func rowsOf(ctx context.Context, db *sql.DB, q string, row func(a, b string)) error {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return fmt.Errorf("%s: %w", q, err)
	}
	defer rows.Close()
	for rows.Next() {
		var a, b string
		if err := rows.Scan(&a, &b); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
		row(a, b)
	}
	return rows.Err()
}

// packedFaults lists what breaks path P's promises in st: acknowledged
// readings neither in the outbox nor applied (lost), receipts not applied,
// events applied twice, ledger keys and effects that disagree.
func packedFaults(st packedState, acked, received []string) (lost, unapplied, twice, split []string) {
	for _, id := range acked {
		if !st.outbox[id] && len(st.effects[id]) == 0 {
			lost = append(lost, id)
		}
	}
	for _, id := range received {
		if len(st.effects[id]) == 0 {
			unapplied = append(unapplied, id)
		}
	}
	for id, rows := range st.effects {
		if len(rows) > 1 {
			twice = append(twice, fmt.Sprintf("%s (%d rows)", id, len(rows)))
		}
		if !st.keys[id] {
			split = append(split, id+" (effect, no ledger key)")
		}
	}
	for id := range st.keys {
		if len(st.effects[id]) == 0 {
			split = append(split, id+" (ledger key, no effect)")
		}
	}
	return lost, unapplied, twice, split
}

// TestPackedChainSurvivesPowerCuts cuts the power of a guest running path
// P (a packing, end-to-end confirmed publisher and a consumer applying
// through a SQLite ledger, one embedded broker between them) at random
// moments on one disk every boot reopens, then boots it once more, with a
// publisher that adds nothing, until every acknowledged reading was
// received. After every cut: 0 acknowledged readings lost, 0 applied
// twice; in the end each applied exactly once, from frames. Cuts must
// leave acknowledged readings waiting (in the outbox, not applied), or
// the run proves nothing about frames in flight.
func TestPackedChainSurvivesPowerCuts(t *testing.T) {
	rng := testRand(t, 4)
	g := newGuest(t, "", "p-pub p-sub")
	drain := newGuest(t, "", "p-drain p-drain-sub")
	img := filepath.Join(t.TempDir(), "disk.img")
	disk(t, img, 128)
	n := cuts(t, 6)
	var acked, received []string
	waitedAtCuts := 0
	verify := func(i int, what string) packedState {
		dir := filepath.Join(t.TempDir(), "data")
		extract(t, img, "/", dir)
		st, err := readPacked(t, dir)
		if err != nil {
			t.Fatalf("%s: path P's files were refused: %v", what, err)
		}
		lost, unapplied, twice, split := packedFaults(st, acked, received)
		waiting, framed := 0, 0
		for _, id := range acked {
			if st.outbox[id] && len(st.effects[id]) == 0 {
				waiting++
			}
		}
		for _, rows := range st.effects {
			if rows[0] != "" {
				framed++
			}
		}
		t.Logf("%s: %d acknowledged, %d received so far; %d applied (%d from frames), %d waiting in the outbox; lost %d, receipts not applied %d, applied twice %d, key/effect splits %d",
			what, len(acked), len(received), len(st.effects), framed, waiting, len(lost), len(unapplied), len(twice), len(split))
		if i <= n {
			waitedAtCuts += waiting
		}
		for what, ids := range map[string][]string{"acknowledged readings lost": lost, "receipts without their effect": unapplied,
			"events applied twice": twice, "ledger keys and effects that disagree": split} {
			if len(ids) > 0 {
				t.Errorf("cut %d: %d %s, e.g. %s", i, len(ids), what, ids[0])
			}
		}
		return st
	}
	for i := 1; i <= n; i++ {
		// Timed from this boot's first receipt, while frames flow, or
		// from the start (sessions resumed, frames resent).
		c, mark := randomCut(t, rng, g, img, i, "R:P")
		acked, received = append(acked, c.Acks["P"]...), append(received, c.Acks["R:P"]...)
		verify(i, fmt.Sprintf("cut %d/%d %.1fs after %s (boot %.1fs)", i, n, c.After.Seconds(),
			map[string]string{"": "the start", "R:P": "the first receipt"}[mark], c.BootTook.Seconds()))
		if t.Failed() {
			t.Logf("serial of cut %d:\n%s", i, tail(c.Serial))
			return
		}
	}

	// The drain: one more boot, ended once every acknowledged reading not
	// yet applied has been received.
	dir := filepath.Join(t.TempDir(), "data")
	extract(t, img, "/", dir)
	st, err := readPacked(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	owed := map[string]bool{}
	for _, id := range acked {
		if len(st.effects[id]) == 0 {
			owed[id] = true
		}
	}
	began := time.Now()
	c := boot(t, drain, img, n+1, "", 8*time.Minute, &drive{until: receivedAll("R:P", owed)})
	if !c.Started {
		t.Fatalf("drain: the guest did not start its scenario:\n%s", tail(c.Serial))
	}
	received = append(received, c.Acks["R:P"]...)
	st = verify(n+1, fmt.Sprintf("drain of %d owed readings in %.0fs", len(owed), time.Since(began).Seconds()))
	framed, notApplied := 0, 0
	for _, id := range acked {
		switch rows := st.effects[id]; {
		case len(rows) == 0:
			notApplied++
		case rows[0] != "":
			framed++
		}
	}
	t.Logf("path P: %d cuts, %d readings acknowledged, %d applied (%d from frames); %d waiting in the outbox, summed over the cuts",
		n, len(acked), len(acked)-notApplied, framed, waitedAtCuts)
	if notApplied > 0 {
		t.Errorf("%d acknowledged readings never applied after the cuts", notApplied)
	}
	if framed == 0 {
		t.Error("no reading was applied from a frame: the run proves nothing about packing")
	}
	if waitedAtCuts == 0 {
		t.Error("no cut left an acknowledged reading waiting in the outbox: the run proves nothing about frames in flight")
	}
}
