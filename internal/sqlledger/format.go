package sqlledger

import (
	"context"
	"fmt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
)

// tableFormat is the version of the ledger's tables (the ledger table, its
// index and its clock's table) that this build writes and the newest it
// reads. It is stored in the one row of <table>_format; a table created
// before that row existed is read as this version and gets the row.
//
// Invariant, enforced by checkFormat before anything else is created or
// written: a ledger whose tables a newer release wrote is refused whole.
const tableFormat = 1

// The same statements serve both drivers: no arguments, standard SQL.
const (
	formatCreateSQL = `CREATE TABLE IF NOT EXISTS %s (
	"id"      INTEGER PRIMARY KEY CHECK ("id" = 1),
	"version" INTEGER NOT NULL
)`
	formatInitSQL = `INSERT INTO %s ("id", "version") VALUES (1, %d) ON CONFLICT ("id") DO NOTHING`
	formatReadSQL = `SELECT "version" FROM %s WHERE "id" = 1`
)

// markFormat creates <table>_format with this build's version if it is
// missing, then checks what it holds.
func (s *Store) markFormat(ctx context.Context) error {
	table := quoteIdent(s.cfg.Table + "_format")
	if err := s.ExecSetup(ctx, fmt.Sprintf(formatCreateSQL, table)); err != nil {
		return fmt.Errorf("create the ledger's format table %s_format: %w", s.cfg.Table, err)
	}
	if _, err := s.db.ExecContext(ctx, fmt.Sprintf(formatInitSQL, table, tableFormat)); err != nil {
		return fmt.Errorf("store the ledger's format in %s_format: %w", s.cfg.Table, err)
	}
	return s.checkFormat(ctx, true)
}

// checkFormat refuses a ledger of a newer format. must: the format row is
// there (markFormat wrote it); without it a missing table or row (a ledger
// written before the row existed, opened to inspect) reads as tableFormat.
func (s *Store) checkFormat(ctx context.Context, must bool) error {
	var v int64
	err := s.db.QueryRowContext(ctx, fmt.Sprintf(formatReadSQL, quoteIdent(s.cfg.Table+"_format"))).Scan(&v)
	if err != nil {
		if must {
			return fmt.Errorf("read the ledger's format from %s_format: %w", s.cfg.Table, err)
		}
		return nil
	}
	return format.Check(s.where, "the SQL ledger table "+s.cfg.Table, uint64(max(v, 0)), tableFormat)
}
