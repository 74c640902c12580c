package sqlledger

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/ledgerclock"
)

// Rows are stamped, and expire, by the table's ledger clock: one row of
// <table>_clock (reading, floor; in applied_at's type), never by a wall
// clock, which a step can move by years either way (internal/ledgerclock).
//
// What it trusts: each process's monotonic clock, for how much time passed
// while it ran, and the database, for the order of transactions. Every
// process sharing the table (a $share group on one PostgreSQL) advances
// the row now and then to the later of the row and its own reading, which
// is the row's value when it last did so plus the monotonic time since,
// counting at most maxStep. So the reading never runs ahead of the time
// some process observed by more than maxStep, however many processes
// there are and whatever their wall clocks say.
//
// Invariants:
//   - a row is stamped with the reading in its own transaction (in the
//     INSERT's SQL, dialect.go and pgbatch.go);
//   - a row goes only when the reading has passed its stamp by retention
//     plus maxStep, and the floor by retention plus maxStep (ExpireDue,
//     which every process's expirer runs before Expire).
//
// Together: a row is deleted only after retention of time a process
// observed. A table that predates the clock, or holds stamps later than
// its reading (written by an older build), gets a reading and a floor: the
// wall clock or its newest stamp, whichever is later; its rows then live
// retention of observed time from then, never less, and still expire.

// startClock creates the clock's row if missing, restarts it if a row is
// stamped after its reading (see above), and starts this process's reading
// from it.
func (s *Store) startClock(ctx context.Context) error {
	var raw any
	if err := s.db.QueryRowContext(ctx, fmt.Sprintf(`SELECT MAX("applied_at") FROM %s`, s.table)).Scan(&raw); err != nil {
		return fmt.Errorf("read the newest applied_at of %s: %w", s.cfg.Table, err)
	}
	newest, err := s.appliedAt(raw)
	if err != nil {
		return err
	}
	var newestNs int64
	if !newest.IsZero() {
		newestNs = newest.UnixNano()
	}
	start := time.Unix(0, ledgerclock.Start(s.cfg.Clock, newestNs))
	if _, err := s.db.ExecContext(ctx, fmt.Sprintf(s.d.sql(commonClockInit), s.clockTable), s.d.timeArg(start)); err != nil {
		return fmt.Errorf("start the ledger clock of %s: %w", s.cfg.Table, err)
	}
	if !newest.IsZero() {
		if _, err := s.db.ExecContext(ctx, fmt.Sprintf(s.d.sql(commonClockRestart), s.clockTable), s.d.timeArg(newest)); err != nil {
			return fmt.Errorf("restart the ledger clock of %s: %w", s.cfg.Table, err)
		}
	}
	reading, _, err := s.readClock(ctx, s.db)
	if err != nil {
		return err
	}
	s.clock = ledgerclock.New(s.cfg.Clock, reading)
	return nil
}

// readClock returns the clock's reading and floor, in Unix nanoseconds.
func (s *Store) readClock(ctx context.Context, q queryer) (reading, floor int64, err error) {
	var r, f any
	err = q.QueryRowContext(ctx, fmt.Sprintf(`SELECT "reading", "floor" FROM %s WHERE "id" = 1`, s.clockTable)).Scan(&r, &f)
	if err == sql.ErrNoRows {
		err = fmt.Errorf("its row is missing")
	}
	if err != nil {
		return 0, 0, fmt.Errorf("read the ledger clock of %s: %w", s.cfg.Table, err)
	}
	rt, err := s.appliedAt(r)
	if err != nil {
		return 0, 0, err
	}
	ft, err := s.appliedAt(f)
	return rt.UnixNano(), ft.UnixNano(), err
}

// AdvanceClock stores this process's reading in the clock's row (the later
// of the two stays) and takes the row's as its own, in one transaction;
// maxStep bounds the time counted since its last advance
// (ledgerclock.Clock.NowWithin). It returns the reading and the floor.
func (s *Store) AdvanceClock(ctx context.Context, maxStep time.Duration) (reading, floor time.Time, err error) {
	mine := time.Unix(0, s.clock.NowWithin(maxStep))
	var r, f int64
	err = s.retry(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(s.d.sql(commonClockAdvance), s.clockTable), s.d.timeArg(mine)); err != nil {
			return err
		}
		var err error
		r, f, err = s.readClock(ctx, tx)
		return err
	}, nil)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("sqlledger: advance the ledger clock of %s: %w", s.cfg.Table, err)
	}
	s.clock.Set(r)
	return time.Unix(0, r), time.Unix(0, f), nil
}

// ExpireDue advances the clock (AdvanceClock) and returns the cutoff for
// Expire: rows stamped before it are past retention of observed time.
// due is false while no row can be (the floor; see above).
func (s *Store) ExpireDue(ctx context.Context, retention, maxStep time.Duration) (cutoff time.Time, due bool, err error) {
	reading, floor, err := s.AdvanceClock(ctx, maxStep)
	if err != nil {
		return time.Time{}, false, err
	}
	cutoff = reading.Add(-retention - maxStep)
	return cutoff, cutoff.After(floor), nil
}
