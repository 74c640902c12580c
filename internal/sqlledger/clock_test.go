package sqlledger

import (
	"fmt"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledgerclock"
)

var day2of1970, today = ledgerclock.Day2of1970, ledgerclock.Today

// The expirer's settings in these tests: retention 1h, a tick every 30 s,
// at most a minute counted per advance.
const (
	testRetention = time.Hour
	testTick      = 30 * time.Second
	testMaxStep   = time.Minute
)

func clocked(f *ledgerclock.Fake) func(*Config) { return func(c *Config) { c.Clock = f.Source() } }

// runFor lets d pass for the stores, ticking their expirers as the pool
// does, and returns the rows left.
func runFor(t *testing.T, f *ledgerclock.Fake, d time.Duration, stores ...*Store) int64 {
	t.Helper()
	for ; d > 0; d -= testTick {
		f.Pass(min(d, testTick))
		for _, s := range stores {
			expireOnce(t, s)
		}
	}
	return count(t, stores[0])
}

// expireOnce is one tick of the pool's expirer.
func expireOnce(t *testing.T, s *Store) {
	t.Helper()
	cutoff, due, err := s.ExpireDue(testCtx(t), testRetention, testMaxStep)
	if err != nil {
		t.Fatal(err)
	}
	if due {
		if _, err := s.Expire(testCtx(t), cutoff, 0); err != nil {
			t.Fatal(err)
		}
	}
}

func recordKeys(t *testing.T, s *Store, prefix string, n int) {
	t.Helper()
	keys := make([]claims.Key, n)
	for i := range keys {
		keys[i] = claims.Key{Namespace: "clock", ID: fmt.Sprint(prefix, i)}
	}
	if _, err := s.Record(testCtx(t), keys, nil); err != nil {
		t.Fatal(err)
	}
}

// A wall clock stepped between runs or during a run never expires a row
// early, and rows still expire after retention (plus the one advance's
// bound) of observed time.
func testClockStepsNeverExpireRowsEarly(t *testing.T, b backend) {
	for _, tc := range ledgerclock.StepCases {
		t.Run(tc.Name, func(t *testing.T) {
			f := ledgerclock.NewFake(tc.Start)
			dsn := b.newDSN(t)
			s := open(t, b, dsn, clocked(f))
			recordKeys(t, s, "k", 50)
			if n := runFor(t, f, 5*time.Minute, s); n != 50 {
				t.Fatalf("5 min: %d rows, want 50", n)
			}
			if tc.DuringRun {
				f.Step(tc.To)
				if n := runFor(t, f, 5*time.Minute, s); n != 50 {
					t.Fatalf("after the step: %d rows, want 50", n)
				}
			}
			s.Close()
			f.Step(tc.To)
			f.Down(3 * time.Hour)
			s = open(t, b, dsn, clocked(f))
			if n := runFor(t, f, 49*time.Minute, s); n != 50 {
				t.Fatalf("54 or 59 min observed: %d rows, want 50", n)
			}
			if n := runFor(t, f, 15*time.Minute, s); n != 0 {
				t.Fatalf("69 or 74 min observed: %d rows, want 0", n)
			}
		})
	}
}

// Processes sharing a table (two stores on one database, wall clocks 56
// years apart) advance its clock at the rate of time, not twice it; one
// that was cut off for a while adds at most testMaxStep when it comes back.
func testSharedClockRunsAtTheRateOfTime(t *testing.T, b backend) {
	ctx := testCtx(t)
	dsn := b.newDSN(t)
	real := ledgerclock.NewFake(today)
	a := open(t, b, dsn, clocked(real))
	// b's process: its own monotonic clock, a wall clock in 2082.
	other := ledgerclock.NewFake(today.AddDate(56, 0, 0))
	bs := open(t, b, dsn, clocked(other))
	start, _, err := a.AdvanceClock(ctx, testMaxStep)
	if err != nil {
		t.Fatal(err)
	}
	recordKeys(t, a, "a", 10)
	recordKeys(t, bs, "b", 10)
	elapsed := time.Duration(0)
	check := func() {
		t.Helper()
		r, _, err := bs.AdvanceClock(ctx, testMaxStep)
		if err != nil {
			t.Fatal(err)
		}
		if ahead := r.Sub(start) - elapsed; ahead > testMaxStep {
			t.Fatalf("after %s the clock advanced %s: %s ahead of the time observed", elapsed, r.Sub(start), ahead)
		}
	}
	for elapsed < 40*time.Minute {
		real.Pass(testTick)
		other.Pass(testTick)
		elapsed += testTick
		expireOnce(t, a)
		// bs is cut off between minutes 20 and 35: its monotonic clock runs on.
		if elapsed <= 20*time.Minute || elapsed > 35*time.Minute {
			expireOnce(t, bs)
		}
		check()
	}
	if n := count(t, a); n != 20 {
		t.Fatalf("40 min: %d rows, want 20", n)
	}
	for elapsed < 80*time.Minute {
		real.Pass(testTick)
		other.Pass(testTick)
		elapsed += testTick
		expireOnce(t, a)
		expireOnce(t, bs)
	}
	if n := count(t, a); n != 0 {
		t.Fatalf("80 min: %d rows, want 0", n)
	}
}

// A table whose rows were stamped with a wall clock (before the ledger
// clock, or by an older build) keeps them for retention of observed time
// from the open, whatever their stamps say, and then lets them go.
func testRowsStampedByAnotherClockExpireAfterRetentionFromOpen(t *testing.T, b backend) {
	for _, stamped := range []time.Time{day2of1970, today.AddDate(74, 0, 0)} {
		t.Run(stamped.Format("2006"), func(t *testing.T) {
			f := ledgerclock.NewFake(today)
			dsn := b.newDSN(t)
			s := open(t, b, dsn, clocked(f))
			exec(t, s, `DROP TABLE "ledger_clock"`)
			for i := range 20 {
				exec(t, s, fmt.Sprintf(`INSERT INTO "ledger" ("namespace", "key", "hash", "applied_at") VALUES ('old', '%d', NULL, %s)`, i, b.ph(1)), s.d.timeArg(stamped))
			}
			s.Close()
			s = open(t, b, dsn, clocked(f))
			if n := runFor(t, f, 59*time.Minute, s); n != 20 {
				t.Fatalf("59 min observed: %d rows, want 20", n)
			}
			if n := runFor(t, f, 5*time.Minute, s); n != 0 {
				t.Fatalf("64 min observed: %d rows, want 0", n)
			}
		})
	}
}

// setReading sets the clock's reading behind the store's back, so that the
// next rows are stamped with at.
func setReading(t *testing.T, s *Store, at time.Time) {
	t.Helper()
	exec(t, s, fmt.Sprintf(`UPDATE %s SET "reading" = %s`, s.clockTable, s.d.placeholder(1)), s.d.timeArg(at))
}
