package ledger

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledgerclock"
)

var day2of1970, today = ledgerclock.Day2of1970, ledgerclock.Today

// openClocked opens a ledger with retention 1h whose expirer does not run
// by itself (the test runs it: expireDue).
func openClocked(t *testing.T, path string, f *ledgerclock.Fake) *Ledger {
	t.Helper()
	return openT(t, path, Options{Retention: time.Hour, ExpireInterval: 24 * time.Hour, Clock: f.Source()})
}

func applyKeys(t *testing.T, l *Ledger, n int) {
	t.Helper()
	for i := range n {
		c, v := claimT(t, l, claims.Key{Namespace: "clock", ID: fmt.Sprint(i)}, "p")
		if v != claims.Pass {
			t.Fatalf("key %d: %v, want pass", i, v)
		}
		if err := c.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// expireRun runs the expirer once and returns the keys left.
func expireRun(t *testing.T, l *Ledger) int64 {
	t.Helper()
	if _, err := l.expireDue(); err != nil {
		t.Fatal(err)
	}
	return l.Stats().Keys
}

// keptThenGone lets kept pass, which brings the keys a minute short of
// retention (1h): all n are still there, and a copy of key is a duplicate;
// 2 min later none is.
func keptThenGone(t *testing.T, l *Ledger, f *ledgerclock.Fake, kept time.Duration, n int64, key claims.Key) {
	t.Helper()
	f.Pass(kept)
	if got := expireRun(t, l); got != n {
		t.Fatalf("a minute before retention: %d keys left, want %d", got, n)
	}
	if _, v := claimT(t, l, key, "p"); v != claims.Duplicate {
		t.Fatalf("a copy of %s a minute before retention: %v, want duplicate", key, v)
	}
	f.Pass(2 * time.Minute)
	if got := expireRun(t, l); got != 0 {
		t.Fatalf("a minute after retention: %d keys left, want 0", got)
	}
}

// A wall clock stepped between runs (ledgerclock.StepCases) or
// during a run never expires a key early, and keys still expire after
// retention of observed time.
func TestClockStepsNeverExpireKeysEarly(t *testing.T) {
	for _, tc := range ledgerclock.StepCases {
		t.Run(tc.Name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ledger.db")
			f := ledgerclock.NewFake(tc.Start)
			l := openClocked(t, path, f)
			applyKeys(t, l, 50)
			f.Pass(10 * time.Minute)
			if tc.DuringRun {
				f.Step(tc.To)
				if n := expireRun(t, l); n != 50 {
					t.Fatalf("after the step: %d keys left, want 50", n)
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			f.Step(tc.To)
			f.Down(3 * time.Hour) // the process was down; that time is not observed
			l = openClocked(t, path, f)
			if n := expireRun(t, l); n != 50 {
				t.Fatalf("reopened after the step: %d keys left, want 50", n)
			}
			keptThenGone(t, l, f, 49*time.Minute, 50, claims.Key{Namespace: "clock", ID: "7"}) // 59 min observed in all
		})
	}
}

// A file whose keys were stamped with the wall clock (before the ledger
// clock, or by an older build) keeps them for retention of observed time
// from the open, whatever their stamps say, and then lets them go.
func TestKeysStampedByAnotherClockExpireAfterRetentionFromOpen(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stamped time.Time
	}{
		{"stamped at 1970", day2of1970},
		{"stamped in 2100", today.AddDate(74, 0, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ledger.db")
			f := ledgerclock.NewFake(today)
			l := openClocked(t, path, f)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			stampRaw(t, path, tc.stamped, 20, true)
			l = openClocked(t, path, f)
			if n := expireRun(t, l); n != 20 {
				t.Fatalf("at open: %d keys left, want 20", n)
			}
			keptThenGone(t, l, f, 59*time.Minute, 20, claims.Key{Namespace: "old", ID: "3"})
		})
	}
}

// stampRaw writes n keys stamped at as a build without the ledger clock
// would (wall-clock stamps, the clock's reading left behind); with
// dropClock the file looks as if written before the ledger clock existed.
func stampRaw(t *testing.T, path string, at time.Time, n int, dropClock bool) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		for i := range n {
			enc, _ := encodeKey(claims.Key{Namespace: "old", ID: fmt.Sprint(i)})
			keys := tx.Bucket(bucketKeys)
			if err := keys.Put(enc, encodeValue(enc, at, hashOf("p"))); err != nil {
				return err
			}
			if err := tx.Bucket(bucketTime).Put(timeKey(at, enc), nil); err != nil {
				return err
			}
			if err := addCount(tx, 1); err != nil {
				return err
			}
		}
		if dropClock {
			for _, k := range [][]byte{keyClock, keyFloor} {
				if err := tx.Bucket(bucketMeta).Delete(k); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// An older build that wrote keys into a file with a ledger clock (a
// rollback, then forward again) left stamps the clock does not know; they
// are kept for retention of observed time too.
func TestStampsAheadOfTheStoredClockRestartIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	f := ledgerclock.NewFake(day2of1970)
	l := openClocked(t, path, f)
	applyKeys(t, l, 5)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	stampRaw(t, path, today, 5, false) // the old build ran with today's wall clock
	l = openClocked(t, path, f)
	keptThenGone(t, l, f, 59*time.Minute, 10, claims.Key{Namespace: "old", ID: "3"})
}

// The stored reading is never behind a stamp, so a process that dies
// without Close restarts its clock after every key it wrote.
func TestStoredClockIsAtLeastEveryStamp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	f := ledgerclock.NewFake(today)
	l := openClocked(t, path, f)
	f.Pass(time.Minute)
	applyKeys(t, l, 3)
	_, _, at, err := l.Lookup(claims.Key{Namespace: "clock", ID: "2"})
	if err != nil {
		t.Fatal(err)
	}
	var stored int64
	_ = l.db.View(func(tx *bolt.Tx) error {
		stored = int64(boltfile.Uint64(tx.Bucket(bucketMeta), keyClock))
		return nil
	})
	if want := today.Add(time.Minute).UnixNano(); at.UnixNano() != want || stored < want {
		t.Fatalf("stamp %v, stored clock %v; want both %v", at, time.Unix(0, stored), time.Unix(0, want))
	}
}
