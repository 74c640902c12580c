package sqlledger

import (
	"strings"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
)

// The ledger's tables name their format in <table>_format; a table created
// before that row existed gets it, and one a newer release wrote is
// refused before anything is created or written.
func TestLedgerTableNamesItsFormatAndANewerOneIsRefused(t *testing.T) {
	b := sqliteBackend()
	dsn := b.newDSN(t)
	version := func(s *Store) (v int) {
		t.Helper()
		if err := s.DB().QueryRowContext(testCtx(t), `SELECT "version" FROM "ledger_format" WHERE "id" = 1`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	s := open(t, b, dsn, nil)
	if v := version(s); v != tableFormat {
		t.Fatalf("a new ledger stores format %d, want %d", v, tableFormat)
	}
	exec(t, s, `DROP TABLE "ledger_format"`) // as written before the row existed
	s.Close()
	s = open(t, b, dsn, nil)
	if v := version(s); v != tableFormat {
		t.Fatalf("an unmarked ledger got format %d, want %d", v, tableFormat)
	}
	exec(t, s, `UPDATE "ledger_format" SET "version" = 2`)
	exec(t, s, `DROP TABLE "ledger_clock"`) // to see that nothing is created
	s.Close()

	for _, open := range []struct {
		name string
		fn   func(Config) (*Store, error)
	}{
		{"Open", func(c Config) (*Store, error) { return Open(testCtx(t), c) }},
		{"OpenExisting", func(c Config) (*Store, error) { return OpenExisting(testCtx(t), c) }},
	} {
		s, err := open.fn(Config{Driver: SQLite, DSN: dsn, Table: "ledger"})
		if err == nil {
			s.Close()
			t.Fatalf("%s opened a ledger of a newer format", open.name)
		}
		if !format.IsNewer(err) {
			t.Fatalf("%s: %v, want a newer-format refusal", open.name, err)
		}
		for _, w := range []string{dsn, "the SQL ledger table ledger", "format version 2", "reads versions 1 to 1", "run the release that wrote it"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: the refusal does not say %q: %v", open.name, w, err)
			}
		}
	}
	db, _, err := OpenDB(Config{Driver: SQLite, DSN: dsn}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(testCtx(t), `SELECT COUNT(*) FROM sqlite_master WHERE name = 'ledger_clock'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the refused ledger was written to: clock table count %d, %v", n, err)
	}
}
