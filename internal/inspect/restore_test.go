package inspect

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// setAsideLikeAnOldRelease moves the records at seqs to outbox/damaged
// the way a release that did not read their version did; flip damages the
// moved copy of one of them.
func setAsideLikeAnOldRelease(t *testing.T, path string, flip uint64, seqs ...uint64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		records, meta := tx.Bucket([]byte("outbox/records")), tx.Bucket([]byte("outbox/meta"))
		aside, err := tx.CreateBucketIfNotExists([]byte("outbox/damaged"))
		if err != nil {
			return err
		}
		count := func(key string, d int) error {
			v := make([]byte, 8)
			if old := meta.Get([]byte(key)); len(old) == 8 {
				d += int(binary.BigEndian.Uint64(old))
			}
			binary.BigEndian.PutUint64(v, uint64(d))
			return meta.Put([]byte(key), v)
		}
		for _, seq := range seqs {
			k := binary.BigEndian.AppendUint64(nil, seq)
			v := append([]byte(nil), records.Get(k)...)
			if seq == flip {
				v[len(v)-6] ^= 1
			}
			if err := aside.Put(k, v); err != nil {
				return err
			}
			if err := records.Delete(k); err != nil {
				return err
			}
			if err := count("damaged", 1); err != nil {
				return err
			}
			if err := count("pending", -1); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestStatAndListNameWhyRecordsAreSetAsideAndRestorePutsThemBack(t *testing.T) {
	path := outboxFile(t) // ev-1 .. ev-3; ev-2 carries MQTT 5 properties (version 3)
	setAsideLikeAnOldRelease(t, path, 3, 2, 3)

	out, errOut, code := run(t, "outbox", "stat", path)
	line := squash(out)
	if code != 0 || !strings.Contains(line, "set aside: 2 records, never published: 1 pass their checksum in a format this build reads") ||
		!strings.Contains(line, "1 fail their checksum, 0 are of a newer record version") {
		t.Fatalf("outbox stat: exit %d\n%s%s", code, out, errOut)
	}
	out, _, _ = run(t, "outbox", "stat", path, "--json")
	var st outboxStatJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.SetAside != (setAside{Readable: 1, Checksum: 1}) || st.Pending != 1 {
		t.Fatalf("outbox stat --json: %v %+v", err, st)
	}
	out, _, code = run(t, "outbox", "list", path)
	if code != 0 || !strings.Contains(squash(out), "2 ev-2 a/c 3 readable: passes its checksum; record version 3") ||
		!strings.Contains(squash(out), "3 0 checksum: fails its checksum") {
		t.Fatalf("outbox list: exit %d\n%s", code, out)
	}

	out, errOut, code = run(t, "outbox", "restore", path)
	if code != 0 || !strings.Contains(out, "restored 1 records to the queue of "+path+" under their original sequence numbers (2)") ||
		!strings.Contains(out, "kept set aside: seq 3") || !strings.Contains(squash(out), "still set aside: 1 records, never published: 0 pass") {
		t.Fatalf("outbox restore: exit %d\n%s%s", code, out, errOut)
	}
	out, _, code = run(t, "outbox", "list", "--json", path)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var got []recordJSON
	for _, l := range lines {
		var r recordJSON
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("list --json line %q: %v", l, err)
		}
		got = append(got, r)
	}
	if code != 0 || len(got) != 3 || got[0].Seq != 1 || got[1].Seq != 2 || got[1].EventID != "ev-2" || got[1].SetAside != "" ||
		string(got[1].Properties) != `{"user":[["traceparent","00-abc-01"]],"content_type":"text/plain"}` ||
		got[2].Seq != 3 || got[2].SetAside != "checksum" {
		t.Fatalf("list --json after restore: exit %d\n%s", code, out)
	}
}

func TestRestoreRefusesWhileAnotherProcessHoldsTheFile(t *testing.T) {
	path := outboxFile(t)
	setAsideLikeAnOldRelease(t, path, 0, 1)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second}) // flock: as another process
	if err != nil {
		t.Fatal(err)
	}
	_, errOut, code := run(t, "outbox", "restore", path)
	db.Close()
	if code == 0 || !strings.Contains(errOut, "is locked by another process") || !strings.Contains(errOut, "nothing restored") {
		t.Fatalf("restore of a held file: exit %d, %s", code, errOut)
	}
	if out, _, _ := run(t, "outbox", "stat", path); !strings.Contains(squash(out), "set aside: 1 records") {
		t.Fatalf("the refused restore changed the file:\n%s", out)
	}
}

func TestOutboxStatNamesTheFormatAndRefusesANewerOne(t *testing.T) {
	path := outboxFile(t)
	if out, _, code := run(t, "outbox", "stat", path); code != 0 || !strings.Contains(squash(out), "format: version 3 (this build reads 1 to 3)") {
		t.Fatalf("outbox stat: exit %d\n%s", code, out)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("outbox/meta")).Put([]byte("format"), binary.BigEndian.AppendUint64(nil, 4))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := run(t, "outbox", "stat", path); code == 0 || !strings.Contains(errOut, "format version 4, and this build reads versions 1 to 3") {
		t.Fatalf("outbox stat of a newer outbox: exit %d, %s", code, errOut)
	}
}
