package sqlledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
)

// Read-only access for tools (`reliable-mqtt ledger ... --driver`).

// OpenExisting connects to an existing ledger table for a tool that only
// reads it: nothing is created, and a missing table (or SQLite file) is an
// error.
func OpenExisting(ctx context.Context, c Config) (*Store, error) {
	d, err := lookupDialect(c.Driver)
	if err != nil {
		return nil, fmt.Errorf("sqlledger: %w", err)
	}
	if path, ok := d.localFile(c.DSN); ok {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("sqlledger: %s database %s: %w", d.name, path, err)
		}
	}
	return connect(ctx, c, false)
}

// Summary describes a ledger table.
type Summary struct {
	Rows           int64
	Oldest, Newest time.Time // applied_at range; zero if empty
	Clock          time.Time // the ledger clock's reading (clock.go); zero if none
}

// Summarize counts the rows and finds the applied_at range (a scan of the
// applied_at index).
func (s *Store) Summarize(ctx context.Context) (Summary, error) {
	var sum Summary
	var oldest, newest any
	q := fmt.Sprintf(`SELECT COUNT(*), MIN("applied_at"), MAX("applied_at") FROM %s`, s.table)
	if err := s.db.QueryRowContext(ctx, q).Scan(&sum.Rows, &oldest, &newest); err != nil {
		return sum, fmt.Errorf("sqlledger: summarize table %s: %w", s.cfg.Table, err)
	}
	var err error
	if sum.Oldest, err = s.appliedAt(oldest); err == nil {
		sum.Newest, err = s.appliedAt(newest)
	}
	if err == nil {
		sum.Clock = s.Clock(ctx)
	}
	return sum, err
}

// Clock returns the ledger clock's reading (clock.go), or the zero time if
// the table has none yet (no process with this build opened it).
func (s *Store) Clock(ctx context.Context) time.Time {
	r, _, err := s.readClock(ctx, s.db)
	if err != nil {
		return time.Time{}
	}
	return time.Unix(0, r)
}

// Entry returns k's stored hash and applied time.
func (s *Store) Entry(ctx context.Context, k claims.Key) (hash []byte, at time.Time, found bool, err error) {
	var raw any
	q := fmt.Sprintf(`SELECT "hash", "applied_at" FROM %s WHERE "namespace" = %s AND "key" = %s`, s.table, s.d.placeholder(1), s.d.placeholder(2))
	err = s.db.QueryRowContext(ctx, q, k.Namespace, k.ID).Scan(&hash, &raw)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, at, false, nil
	}
	if err != nil {
		return nil, at, false, fmt.Errorf("sqlledger: %s in table %s: %w", k, s.cfg.Table, err)
	}
	at, err = s.appliedAt(raw)
	return hash, at, true, err
}

// appliedAt converts a stored applied_at: Unix microseconds in SQLite, a
// timestamp in PostgreSQL; NULL (MIN of no rows) is the zero time.
func (s *Store) appliedAt(v any) (time.Time, error) {
	switch t := v.(type) {
	case nil:
		return time.Time{}, nil
	case int64:
		return time.UnixMicro(t), nil
	case time.Time:
		return t, nil
	}
	return time.Time{}, fmt.Errorf("sqlledger: table %s: applied_at holds a %T, want %s", s.cfg.Table, v, s.d.appliedAtType)
}
