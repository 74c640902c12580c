// Package inspect holds the `reliable-mqtt outbox ...` and `reliable-mqtt
// ledger ...` commands: an operator's view of an outbox or ledger file
// without writing Go, added beside Benthos's own CLI verbs.
//
// Every command that only reads opens the file read-only (bbolt's shared
// lock), so it never changes a byte; a file held by a running process is
// reported within lockTimeout instead of waiting. Only `outbox purge --yes`
// writes, through the outbox's own Remove.
package inspect

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/urfave/cli/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
)

// sqliteMagic starts every SQLite database file.
const sqliteMagic = "SQLite format 3\x00"

// isSQLite reports whether the file at path is a SQLite database: a
// ledger kept with sql that a user names as if it were a bbolt file.
func isSQLite(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, len(sqliteMagic))
	_, err = io.ReadFull(f, head)
	return err == nil && string(head) == sqliteMagic
}

// lockTimeout bounds the wait for a file another process holds.
const lockTimeout = time.Second

// interspersed lets flags follow the positional arguments, as the usage
// lines show (`stat FILE --json`): urfave/cli v2 stops parsing flags at the
// first argument. The command is registered with SkipFlagParsing and its
// flags are parsed here, arguments and flags in any order.
func interspersed(cmd *cli.Command) *cli.Command {
	action := cmd.Action
	cmd.SkipFlagParsing = true
	cmd.Action = func(c *cli.Context) error {
		fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		for _, f := range cmd.Flags {
			if err := f.Apply(fs); err != nil {
				return err
			}
		}
		var positional []string
		for rest := c.Args().Slice(); ; {
			if err := fs.Parse(rest); err != nil {
				return fmt.Errorf("%s: %w (usage: %s)", cmd.FullName(), err, cmd.UsageText)
			}
			if fs.NArg() == 0 {
				break
			}
			positional = append(positional, fs.Arg(0))
			rest = fs.Args()[1:]
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if set["help"] || set["h"] {
			return cli.ShowCommandHelp(c.Lineage()[1], cmd.Name)
		}
		// Each alias is a flag of its own in a plain FlagSet: copy the
		// value given under one name to the others.
		for _, f := range cmd.Flags {
			for _, given := range f.Names() {
				if !set[given] {
					continue
				}
				for _, other := range f.Names() {
					if other != given {
						_ = fs.Set(other, fs.Lookup(given).Value.String())
					}
				}
			}
		}
		// Parse once more with only the arguments so Args() returns them.
		_ = fs.Parse(append([]string{"--"}, positional...))
		cc := cli.NewContext(c.App, fs, c)
		cc.Command = cmd
		return action(cc)
	}
	return cmd
}

// view runs fn in a read-only transaction on the file at path. live names
// the metrics a running process exports, for the "locked" message.
func view(path, live string, fn func(tx *bolt.Tx) error) (err error) {
	return viewWith(boltfile.OpenReadOnly, path, live, fn)
}

// viewVerified is view after verifying the file's structure (every page
// read, bbolt's consistency check): a damaged file is an error.
func viewVerified(path, live string, fn func(tx *bolt.Tx) error) (err error) {
	return viewWith(boltfile.OpenReadOnlyVerified, path, live, fn)
}

func viewWith(open func(string, time.Duration) (*bolt.DB, error), path, live string, fn func(tx *bolt.Tx) error) (err error) {
	db, err := open(path, lockTimeout)
	if err != nil {
		if errors.Is(err, boltfile.ErrLocked) {
			return fmt.Errorf("%s is locked by another process (a running reliable-mqtt?) and cannot be read while it runs: stop that process to inspect the file, or read its live state from its metrics (%s at /metrics with `metrics: prometheus: {}`)", path, live)
		}
		if isSQLite(path) {
			return fmt.Errorf("%s is a SQLite database, not a bbolt file. A dedup_ledger with sql (driver: sqlite) is read with: reliable-mqtt ledger lookup --driver sqlite --dsn %s --table TABLE [--namespace NS] KEY (TABLE is the ledger's sql.table; `ledger stat` takes the same flags)", path, path)
		}
		return err
	}
	defer db.Close()
	// A damaged page can fault when a record is read, not only at open.
	return boltfile.Guard(path, func() error { return db.View(fn) })
}

// fileArg returns the command's single FILE argument.
func fileArg(c *cli.Context) (string, error) {
	if c.NArg() != 1 {
		return "", fmt.Errorf("%s: expected one FILE argument, got %d (usage: %s)", c.Command.FullName(), c.NArg(), c.Command.UsageText)
	}
	return c.Args().First(), nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// timeOrNil renders t for JSON: null when zero.
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// when renders t for people: RFC 3339 and how long ago.
func when(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%s (%s)", t.UTC().Format(time.RFC3339Nano), humanize.RelTime(t, now, "ago", "from now"))
}

var jsonFlag = &cli.BoolFlag{Name: "json", Usage: "print JSON for scripts"}
