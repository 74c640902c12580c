package rollback

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// A file or record written by a newer release stops this build at start,
// with one message naming the file, the version found, the versions this
// build reads and what to do; nothing is set aside.
func TestANewerFormatStopsThisBuildAtStart(t *testing.T) {
	for _, c := range []struct {
		name, what string
		stamp      func(tx *bolt.Tx) error
	}{
		{"record", "outbox record seq 7", func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("outbox/records"))
			k := binary.BigEndian.AppendUint64(nil, 7)
			v := b.Get(k)
			body := append([]byte{4}, v[1:len(v)-4]...)
			return b.Put(k, binary.BigEndian.AppendUint32(body, boltfile.Checksum(k, body)))
		}},
		{"file", "the outbox", func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("outbox/meta")).Put([]byte("format"), binary.BigEndian.AppendUint64(nil, 4))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "outbox.db")
			write(t, harness.Binary(t), path)
			db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(c.stamp); err != nil {
				t.Fatal(err)
			}
			db.Close()

			noBroker := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
			p := harness.RunPipeline(t, drainConfig(noBroker, path), harness.ProcOptions{})
			code, err := p.Wait(runWait)
			if err != nil || code == 0 {
				t.Fatalf("this build on a newer %s: exit %d, %v", c.name, code, err)
			}
			log := p.Log()
			var line string
			for _, l := range strings.Split(log, "\n") {
				if strings.Contains(l, "written in a newer format") {
					line = l
				}
			}
			t.Logf("%s", line)
			for _, s := range []string{path, c.what, "format version 4", "this build reads versions 1 to 3", "run the release that wrote it, or a newer one"} {
				if !strings.Contains(line, s) {
					t.Errorf("the refusal does not say %q:\n%s", s, log)
				}
			}
			if pending, aside := recordVersions(t, path); len(pending) != records || len(aside) != 0 {
				t.Fatalf("after the refusal: %d pending, %d set aside", len(pending), len(aside))
			}
		})
	}
}
