package inspect

import (
	"context"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
)

// ledgerLive names the metrics that show a running dedup_ledger.
const ledgerLive = "dedup_ledger_keys, dedup_ledger_passed, dedup_ledger_duplicates"

// sqlTimeout bounds a whole SQL command, connection included.
const sqlTimeout = 15 * time.Second

var sqlFlags = []cli.Flag{
	&cli.StringFlag{Name: "driver", Usage: "read a SQL ledger instead of a bbolt FILE: `sqlite` or `postgres`"},
	&cli.StringFlag{Name: "dsn", Usage: "the SQL ledger's database (sql.dsn of the processor)"},
	&cli.StringFlag{Name: "table", Value: "dedup_ledger", Usage: "the SQL ledger's `TABLE` (sql.table)"},
	jsonFlag,
}

// LedgerCommand is `reliable-mqtt ledger ...`.
func LedgerCommand() *cli.Command {
	return &cli.Command{
		Name:  "ledger",
		Usage: "Inspect a dedup_ledger (bbolt file or SQL table)",
		Description: "A bbolt file is opened read-only; a file held by a running process cannot be\n" +
			"read: stop it, or watch its metrics. A SQL table is only read.",
		Subcommands: []*cli.Command{
			interspersed(&cli.Command{
				Name:  "stat",
				Usage: "Applied keys and the range of their applied times",
				UsageText: "reliable-mqtt ledger stat FILE [--json]\n" +
					"reliable-mqtt ledger stat --driver sqlite|postgres --dsn DSN [--table TABLE] [--json]",
				Flags:  sqlFlags,
				Action: ledgerStat,
			}),
			interspersed(&cli.Command{
				Name:  "lookup",
				Usage: "Whether KEY is applied, when, and its payload's SHA-256",
				UsageText: "reliable-mqtt ledger lookup FILE KEY [--namespace NS] [--json]\n" +
					"reliable-mqtt ledger lookup --driver sqlite|postgres --dsn DSN [--table TABLE] KEY [--namespace NS] [--json]",
				Flags: append([]cli.Flag{
					&cli.StringFlag{Name: "namespace", Usage: "the key's namespace (the processor's `namespace`, e.g. the producer)"},
				}, sqlFlags...),
				Action: ledgerLookup,
			}),
		},
	}
}

// ledgerSource is either a bbolt file or a SQL table.
type ledgerSource struct {
	file string
	sql  sqlledger.Config
}

// source reads the FILE argument or the SQL flags; rest are the
// arguments after FILE.
func source(c *cli.Context, wantArgs int) (src ledgerSource, rest []string, err error) {
	args := c.Args().Slice()
	if d := c.String("driver"); d != "" {
		if c.String("dsn") == "" {
			return src, nil, fmt.Errorf("%s: --driver %s needs --dsn", c.Command.FullName(), d)
		}
		src.sql = sqlledger.Config{Driver: sqlledger.Driver(d), DSN: c.String("dsn"), Table: c.String("table"), MaxOpenConns: 1}
	} else {
		if len(args) == 0 {
			return src, nil, fmt.Errorf("%s: name a bbolt FILE, or a SQL ledger with --driver and --dsn (usage: %s)", c.Command.FullName(), c.Command.UsageText)
		}
		if lower := strings.ToLower(args[0]); strings.HasPrefix(lower, "postgres://") || strings.HasPrefix(lower, "postgresql://") {
			return src, nil, fmt.Errorf("%s: %q is a PostgreSQL DSN, not a bbolt FILE: use --driver postgres --dsn DSN [--table TABLE] (usage: %s)", c.Command.FullName(), args[0], c.Command.UsageText)
		}
		if src.file, err = filepath.Abs(args[0]); err != nil {
			return src, nil, err
		}
		args = args[1:]
	}
	if len(args) != wantArgs {
		return src, nil, fmt.Errorf("%s: unexpected arguments %q (usage: %s; flags go before the arguments)", c.Command.FullName(), args, c.Command.UsageText)
	}
	return src, args, nil
}

// withSQL opens the SQL ledger read-only and runs fn.
func withSQL(cfg sqlledger.Config, fn func(ctx context.Context, s *sqlledger.Store) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), sqlTimeout)
	defer cancel()
	s, err := sqlledger.OpenExisting(ctx, cfg)
	if err != nil {
		return tableHint(err, cfg.Table)
	}
	defer s.Close()
	return tableHint(fn(ctx, s), cfg.Table)
}

// tableHint adds to a missing-table error (SQLite's or PostgreSQL's) that
// --table names it: a ledger's sql.table is often not the default.
func tableHint(err error, table string) error {
	if msg := fmt.Sprint(err); strings.Contains(msg, "no such table") || (strings.Contains(msg, "relation") && strings.Contains(msg, "does not exist")) {
		return fmt.Errorf("%w (--table names the ledger's sql.table; it is %q now)", err, table)
	}
	return err
}

type ledgerStatJSON struct {
	Source string     `json:"source"`
	Keys   int64      `json:"keys"`
	Oldest *time.Time `json:"oldest"`
	Newest *time.Time `json:"newest"`
	// Clock is the ledger clock's reading: keys are stamped, and expire,
	// by it rather than by the wall clock.
	Clock *time.Time `json:"ledger_clock"`
	// Verified says what was checked before the counts were believed.
	Verified string `json:"verified"`
}

// ledgerStat verifies a bbolt file before it reports anything; a damaged
// file is an error, exit 1. A SQL table's integrity is its database's job.
func ledgerStat(c *cli.Context) error {
	src, _, err := source(c, 0)
	if err != nil {
		return err
	}
	var out ledgerStatJSON
	if src.file != "" {
		err = viewVerified(src.file, ledgerLive, func(tx *bolt.Tx) error {
			checked, err := ledger.Check(tx, src.file)
			if err != nil {
				return err
			}
			s, err := ledger.Summarize(tx, src.file)
			out = ledgerStatJSON{Source: src.file, Keys: s.Keys, Oldest: timeOrNil(s.Oldest), Newest: timeOrNil(s.Newest), Clock: timeOrNil(s.Clock),
				Verified: fmt.Sprintf("every page read, bbolt's consistency check passed, %d entries pass their checksums, none missing by its counter", checked)}
			return err
		})
	} else {
		err = withSQL(src.sql, func(ctx context.Context, s *sqlledger.Store) error {
			sum, err := s.Summarize(ctx)
			out = ledgerStatJSON{Source: fmt.Sprintf("%s table %s", src.sql.Driver, src.sql.Table), Keys: sum.Rows, Oldest: timeOrNil(sum.Oldest), Newest: timeOrNil(sum.Newest), Clock: timeOrNil(sum.Clock),
				Verified: "no: a SQL table's integrity is its database's"}
			return err
		})
	}
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, out)
	}
	now := ledgerNow(out.Clock)
	w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "ledger:\t%s\n", out.Source)
	fmt.Fprintf(w, "applied keys:\t%d\n", out.Keys)
	if out.Clock != nil {
		fmt.Fprintf(w, "ledger clock:\t%s (keys are stamped and expire by it; it counts only time the ledger was open)\n", out.Clock.UTC().Format(time.RFC3339Nano))
	}
	if out.Keys > 0 {
		fmt.Fprintf(w, "oldest applied:\t%s\n", when(deref(out.Oldest), now))
		fmt.Fprintf(w, "newest applied:\t%s\n", when(deref(out.Newest), now))
	}
	fmt.Fprintf(w, "verified:\t%s\n", out.Verified)
	return w.Flush()
}

// ledgerNow is what a ledger's times are "ago" from: its clock's stored
// reading, which a wall-clock step does not move; the wall clock for a
// ledger that has none.
func ledgerNow(clock *time.Time) time.Time {
	if clock == nil {
		return time.Now()
	}
	return *clock
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

type lookupJSON struct {
	Namespace string     `json:"namespace"`
	Key       string     `json:"key"`
	Applied   bool       `json:"applied"`
	At        *time.Time `json:"applied_at,omitempty"`
	Hash      string     `json:"sha256,omitempty"`
	Clock     *time.Time `json:"ledger_clock,omitempty"` // as in ledgerStatJSON
}

func ledgerLookup(c *cli.Context) error {
	src, args, err := source(c, 1)
	if err != nil {
		return err
	}
	out := lookupJSON{Namespace: c.String("namespace"), Key: args[0]}
	if src.file != "" {
		err = view(src.file, ledgerLive, func(tx *bolt.Tx) error {
			e, err := ledger.LookupIn(tx, src.file, claims.Key{Namespace: out.Namespace, ID: out.Key})
			out.Applied, out.At, out.Clock = e.Applied, timeOrNil(e.At), timeOrNil(ledger.StoredClock(tx))
			if e.Applied {
				out.Hash = hex.EncodeToString(e.Hash[:])
			}
			return err
		})
	} else {
		err = withSQL(src.sql, func(ctx context.Context, s *sqlledger.Store) error {
			hash, at, found, err := s.Entry(ctx, claims.Key{Namespace: out.Namespace, ID: out.Key})
			out.Applied, out.At, out.Hash, out.Clock = found, timeOrNil(at), hex.EncodeToString(hash), timeOrNil(s.Clock(ctx))
			return err
		})
	}
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, out)
	}
	name := fmt.Sprintf("%q", out.Key)
	if out.Namespace != "" {
		name = fmt.Sprintf("%q in namespace %q", out.Key, out.Namespace)
	}
	if !out.Applied {
		fmt.Fprintf(c.App.Writer, "key %s: not applied (or expired by retention)\n", name)
		return nil
	}
	hash := out.Hash
	if hash == "" {
		hash = "(none stored)"
	}
	fmt.Fprintf(c.App.Writer, "key %s: applied %s\npayload sha256: %s\n", name, when(deref(out.At), ledgerNow(out.Clock)), hash)
	return nil
}
