package powerloss

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	bolt "go.etcd.io/bbolt"
)

// Path E: removal from the outbox after confirmation, and the embedded
// broker's store. Two processes share the embedded broker's data directory
// /data/broker:
//
//	e-pub  generate -> [reliable_mqtt_out (outbox /data/e-outbox.db,
//	       confirm: broker), stdout]: "E-<cycle>-<n>" once the record is in
//	       the outbox; the sender publishes it to the embedded broker, which
//	       runs in this process (embedded://, listening on 127.0.0.1:1884),
//	       and removes it at the broker's PUBACK, which the broker sends only
//	       after its own commit (internal/embedded/store.go).
//	e-sub  started 8 s later (until then its persistent session is offline
//	       and the broker queues for it what it PUBACKs):
//	       reliable_mqtt_in (tcp://127.0.0.1:1884, QoS 1) ->
//	       dedup_ledger (/data/e-recv.db, commit: immediate) -> stdout
//	       "R:E-<cycle>-<n>"; the PUBACK to the broker follows the ledger's
//	       commit. Each message first sleeps 350 ms: the outbox removes a
//	       confirmed record only with its next append (up to 400 ms
//	       later), so a subscriber that took each record at once would
//	       leave no moment at which a removed record is held by the broker
//	       alone.
//
// After every cut, every E record acknowledged so far must be somewhere a
// later start delivers it from: still in the outbox, in the broker's store
// (an inflight message of the subscriber's session, or a fan-out record),
// or in the subscriber's ledger (received). A record in the outbox and in
// the ledger is a confirmed record that came back: a duplicate, allowed.
// A last boot without a cut (the drain) must then deliver every one.
func init() {
	pub := func(interval, prefix string) string {
		return outboxConfig(prefix, interval, "embedded://?dir=/data/broker&listen=127.0.0.1:1884", "powerloss-e-pub", "powerloss/e", "/data/e-outbox.db")
	}
	// 2.5 records a second: about what the chain (a broker commit per
	// PUBACK, a ledger commit per receipt) delivers on the guest's one
	// emulated CPU beside paths A-D, so the outbox does not grow without
	// end and a last boot can drain it.
	configs["cfg/e-pub.yaml"] = pub("400ms", "E")
	// The setup and drain boots publish a marker every second: its
	// receipt shows the subscription is in place.
	configs["cfg/e-mark.yaml"] = pub("1s", "S")
	configs["cfg/e-sub.yaml"] = `
http: {enabled: false}
logger: {level: WARN}
input:
  reliable_mqtt_in:
    urls: [ "tcp://127.0.0.1:1884" ]
    client_id: powerloss-e-sub
    topics: [ powerloss/e ]
    qos: 1
pipeline:
  processors:
    - sleep: { duration: 350ms }
    - dedup_ledger: { path: /data/e-recv.db, key: '${! content() }', commit: immediate }
    - mapping: 'root = "R:" + content().string() + "\n"'
output:
  stdout: { codec: all-bytes }
`
	commands["e-sub-late"] = `sh -c "sleep 8; exec reliable-mqtt -c /cfg/e-sub.yaml"`
}

// commands: a process name's command, when it is not
// reliable-mqtt -c /cfg/<name>.yaml.
var commands = map[string]string{}

// relayState is where path E's records are on the disk after a cut.
type relayState struct {
	outbox, broker, received map[string]bool
	refused                  []error
}

// readRelayE reads path E's three files with the project's code (the
// outbox and ledger) and bbolt plus mochi's storage types (the broker's
// store). A file not there yet is empty: whatever it should hold counts
// as lost.
func readRelayE(t *testing.T, dir string, acked []string) relayState {
	st := relayState{outbox: map[string]bool{}, broker: map[string]bool{}, received: map[string]bool{}}
	if p := filepath.Join(dir, "e-outbox.db"); exists(p) {
		if f := readOutbox(t, p); f.refused != nil {
			st.refused = append(st.refused, f.refused)
		} else {
			st.outbox = f.ids
		}
	}
	if p := filepath.Join(dir, "e-recv.db"); exists(p) {
		if f := readLedger(t, p, acked); f.refused != nil {
			st.refused = append(st.refused, f.refused)
		} else {
			for id, ok := range f.ids {
				if ok {
					st.received[id] = true
				}
			}
		}
	}
	if p := filepath.Join(dir, "broker", "broker.db"); exists(p) {
		held, err := brokerHeld(p)
		if err != nil {
			st.refused = append(st.refused, err)
		} else {
			st.broker = held
		}
	}
	return st
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// brokerHeld lists the payloads (here: event IDs) of the messages the
// embedded broker's store holds for delivery: inflight messages of stored
// sessions, and fan-out records a start re-publishes (the buckets named in
// internal/embedded/store.go).
func brokerHeld(path string) (map[string]bool, error) {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("broker store %s: %w", path, err)
	}
	defer db.Close()
	held := map[string]bool{}
	err = db.View(func(tx *bolt.Tx) error {
		var first error
		for err := range tx.Check() { // read to the end: the check runs on the tx
			first = cmp.Or(first, err)
		}
		if first != nil {
			return first
		}
		for _, name := range []string{"inflight", "fanout"} {
			b := tx.Bucket([]byte(name))
			if b == nil {
				continue // not created yet: the cut fell in the broker's first start
			}
			if err := b.ForEach(func(k, v []byte) error {
				var m storage.Message
				if err := m.UnmarshalBinary(v); err != nil {
					return fmt.Errorf("%s record %x: %w", name, k, err)
				}
				held[string(m.Payload)] = true
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("broker store %s: %w", path, err)
	}
	return held, nil
}

// relayTally counts path E over a run.
type relayTally struct {
	acked, lost, refused int
	brokerOnly           int // at a cut: confirmed (gone from the outbox), held only by the broker's store
	duplicates           int // at a cut: received and back in the outbox
	deliveredAfter       int // held only by the broker at some cut, received later
}

// checkRelayE compares a cut's disk with path E's acknowledged records.
func checkRelayE(t *testing.T, i int, dir string, acked []string, tl *relayTally, brokerOnly map[string]bool) relayState {
	st := readRelayE(t, dir, acked)
	for _, err := range st.refused {
		tl.refused++
		t.Errorf("cut %d: a file of path E was refused after a cut: %v", i, err)
	}
	var missing []string
	for _, id := range acked {
		in, br, rc := st.outbox[id], st.broker[id], st.received[id]
		switch {
		case !in && !br && !rc:
			missing = append(missing, id)
		case !in && br && !rc:
			tl.brokerOnly++
			brokerOnly[id] = true
		case in && rc:
			tl.duplicates++
		}
	}
	if len(missing) > 0 {
		tl.lost += len(missing)
		t.Errorf("cut %d: path E lost %d acknowledged records (in neither the outbox, the broker's store nor the subscriber's ledger), e.g. %q", i, len(missing), missing[0])
	}
	return st
}

// relaySetup boots the drain guest until the subscriber received a
// marker: its persistent session and subscription are then in the
// broker's store (stored before the SUBACK), so the cut boots that follow
// publish to a session that exists, online or not.
func relaySetup(t *testing.T, g guest, img string) {
	for try := 1; try <= 3; try++ {
		c := boot(t, g, img, 0, "", 6*time.Minute, &drive{until: func(a map[string][]string) bool { return len(a["R:S"]) > 0 }})
		if len(c.Acks["R:S"]) > 0 {
			return
		}
		t.Logf("setup boot %d: no marker received before the boot's limit:\n%s", try, tail(c.Serial))
	}
	t.Fatal("path E: the subscriber never received a marker in three setup boots")
}

// relayDrain boots the drain guest until the subscriber received every
// acknowledged E record not yet in its ledger, then checks the ledger
// holds them all: what the broker PUBACKed was delivered after the cuts.
func relayDrain(t *testing.T, g guest, img string, n int, acked []string, tl *relayTally, brokerOnly map[string]bool) {
	dir := filepath.Join(t.TempDir(), "data")
	extract(t, img, "/", dir)
	owed := map[string]bool{}
	for _, id := range acked {
		owed[id] = true
	}
	for id, ok := range readRelayE(t, dir, acked).received {
		if ok {
			delete(owed, id)
		}
	}
	began := time.Now()
	c := boot(t, g, img, n, "", 8*time.Minute, &drive{until: receivedAll("R:E", owed)})
	if !c.Started {
		t.Fatalf("path E drain: the guest did not start its scenario:\n%s", tail(c.Serial))
	}
	dir = filepath.Join(t.TempDir(), "data")
	extract(t, img, "/", dir)
	st := readRelayE(t, dir, acked)
	var missing []string
	for _, id := range acked {
		if !st.received[id] {
			missing = append(missing, id)
		} else if brokerOnly[id] {
			tl.deliveredAfter++
		}
	}
	t.Logf("path E drain: %d owed records, %d received in %.0fs; %d of %d acknowledged records in the subscriber's ledger",
		len(owed), len(c.Acks["R:E"]), time.Since(began).Seconds(), len(acked)-len(missing), len(acked))
	if len(missing) > 0 {
		t.Errorf("path E: %d acknowledged records never delivered after the cuts, e.g. %q\n%s", len(missing), missing[0], tail(c.Serial))
	}
}

// receivedAll is a drain boot's end: the lines of receipts (e.g. "R:E")
// printed so far cover every owed ID.
func receivedAll(receipts string, owed map[string]bool) func(acks map[string][]string) bool {
	return func(acks map[string][]string) bool {
		got := 0
		for _, id := range acks[receipts] {
			if owed[id] {
				got++
			}
		}
		return got >= len(owed)
	}
}
