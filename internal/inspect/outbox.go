package inspect

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/dustin/go-humanize"
	"github.com/schollz/progressbar/v3"
	"github.com/urfave/cli/v2"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/term"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
)

// outboxLive names the metrics that show a running output's backlog.
const outboxLive = "reliable_mqtt_out_pending, reliable_mqtt_out_pending_bytes, reliable_mqtt_out_oldest_pending_age_ms"

// progressThreshold: an export of more records than this shows a progress
// bar when stderr is a terminal.
const progressThreshold = 10_000

// OutboxCommand is `reliable-mqtt outbox ...`.
func OutboxCommand() *cli.Command {
	return &cli.Command{
		Name:  "outbox",
		Usage: "Inspect, export or purge a reliable_mqtt_out outbox file",
		Description: "The file is opened read-only (except by purge --yes and restore). A file held by a\n" +
			"running process cannot be read: stop it, or watch its metrics.",
		Subcommands: []*cli.Command{
			interspersed(&cli.Command{
				Name:      "stat",
				Usage:     "Pending count, bytes, oldest and newest record, the stored client ID (used while client_id is empty)",
				UsageText: "reliable-mqtt outbox stat FILE [--json]",
				Flags:     []cli.Flag{jsonFlag},
				Action:    outboxStat,
			}),
			interspersed(&cli.Command{
				Name:      "list",
				Usage:     "Pending records in FIFO order: seq, event ID, topic, size, age",
				UsageText: "reliable-mqtt outbox list FILE [--limit N] [--after SEQ] [--json]",
				Flags: []cli.Flag{
					&cli.IntFlag{Name: "limit", Value: 100, Usage: "list at most `N` records (0: all)"},
					&cli.Uint64Flag{Name: "after", Usage: "start after sequence number `SEQ`"},
					jsonFlag,
				},
				Action: outboxList,
			}),
			interspersed(&cli.Command{
				Name:      "export",
				Usage:     "Write every pending record as one JSON line (payload base64 when not UTF-8)",
				UsageText: "reliable-mqtt outbox export FILE [-o out.jsonl]",
				Flags: []cli.Flag{
					&cli.PathFlag{Name: "output", Aliases: []string{"o"}, Usage: "write to `FILE` (must not exist) instead of stdout"},
				},
				Action: outboxExport,
			}),
			interspersed(&cli.Command{
				Name: "restore",
				Usage: "Put back in the queue, under their original sequence numbers, the set-aside records " +
					"that pass their checksum in a format this build reads (the process must be stopped)",
				UsageText: "reliable-mqtt outbox restore FILE",
				Action:    outboxRestore,
			}),
			interspersed(&cli.Command{
				Name:  "purge",
				Usage: "Remove pending records for good (logged; refuses without --yes)",
				UsageText: "reliable-mqtt outbox purge FILE --event-id ID [--event-id ID ...] [--yes]\n" +
					"reliable-mqtt outbox purge FILE --older-than DURATION [--yes]",
				Flags: []cli.Flag{
					&cli.StringSliceFlag{Name: "event-id", Usage: "remove the pending record with event ID `ID` (repeatable)"},
					&cli.DurationFlag{Name: "older-than", Usage: "remove every record enqueued more than `DURATION` ago by the wall clock (enqueue times are wall-clock stamps: check them with list first if the clock was ever wrong)"},
					&cli.BoolFlag{Name: "yes", Usage: "really remove; without it, only show what would be removed"},
				},
				Action: outboxPurge,
			}),
		},
	}
}

// outboxView runs fn on the outbox file named by the command's argument.
func outboxView(c *cli.Context, fn func(path string, tx *bolt.Tx) error) error {
	return outboxViewWith(view, c, fn)
}

func outboxViewWith(v func(string, string, func(*bolt.Tx) error) error, c *cli.Context, fn func(path string, tx *bolt.Tx) error) error {
	path, err := fileArg(c)
	if err != nil {
		return err
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return v(path, outboxLive, func(tx *bolt.Tx) error { return fn(path, tx) })
}

type outboxStatJSON struct {
	File         string     `json:"file"`
	Pending      int        `json:"pending"`
	PendingBytes int64      `json:"pending_bytes"`
	FirstSeq     uint64     `json:"first_seq,omitempty"`
	LastSeq      uint64     `json:"last_seq,omitempty"`
	Oldest       *time.Time `json:"oldest"`
	Newest       *time.Time `json:"newest"`
	ClientID     string     `json:"client_id"`
	Damaged      int        `json:"damaged"`
	SetAside     setAside   `json:"set_aside"`
	Format       uint64     `json:"format"` // 0: written before format markers (read as the current one)
	Verified     string     `json:"verified"`
}

// setAside counts the records in outbox/damaged by what this build finds.
type setAside struct {
	Readable    int `json:"readable"` // pass their checksum: `outbox restore` puts them back
	Checksum    int `json:"checksum"`
	NewerFormat int `json:"newer_format"`
	Unreadable  int `json:"unreadable"`
}

func countAside(tx *bolt.Tx, path string) (a setAside, err error) {
	err = outbox.EachAside(tx, path, func(r outbox.AsideRecord) error { a.add(r.Kind); return nil })
	return a, err
}

func (a *setAside) add(k outbox.AsideKind) {
	switch k {
	case outbox.AsideReadable:
		a.Readable++
	case outbox.AsideChecksum:
		a.Checksum++
	case outbox.AsideNewer:
		a.NewerFormat++
	default:
		a.Unreadable++
	}
}

// String is stat's "set aside" line.
func (a setAside) String() string {
	total := a.Readable + a.Checksum + a.NewerFormat + a.Unreadable
	if total == 0 {
		return "0 records"
	}
	hint := ""
	if a.Readable > 0 {
		hint = " (`reliable-mqtt outbox restore FILE` puts them back)"
	}
	return fmt.Sprintf("%d records, never published: %d pass their checksum in a format this build reads%s, %d fail their checksum, %d are of a newer record version, %d are unreadable otherwise; `outbox list` names each",
		total, a.Readable, hint, a.Checksum, a.NewerFormat, a.Unreadable)
}

// outboxStat verifies the file before it reports anything: counters read
// from a damaged file would be believed (a pending count beside a newest
// sequence number lower than it). A damaged file is an error, exit 1.
func outboxStat(c *cli.Context) error {
	return outboxViewWith(viewVerified, c, func(path string, tx *bolt.Tx) error {
		checked, err := outbox.Check(tx, path)
		if err != nil {
			return err
		}
		s, err := outbox.Summarize(tx, path)
		if err != nil {
			return err
		}
		aside, err := countAside(tx, path)
		if err != nil {
			return err
		}
		verified := fmt.Sprintf("every page read, bbolt's consistency check passed, %d records pass their checksums, none missing by its counter", checked)
		out := c.App.Writer
		if c.Bool("json") {
			return writeJSON(out, outboxStatJSON{
				File: path, Pending: s.Pending, PendingBytes: s.PendingBytes,
				FirstSeq: s.FirstSeq, LastSeq: s.LastSeq,
				Oldest: timeOrNil(s.Oldest), Newest: timeOrNil(s.Newest),
				ClientID: s.ClientID, Damaged: s.Damaged, SetAside: aside, Format: s.Format, Verified: verified,
			})
		}
		now := time.Now()
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintf(w, "file:\t%s\n", path)
		fmt.Fprintf(w, "pending:\t%d records, %d bytes (%s)\n", s.Pending, s.PendingBytes, humanize.IBytes(uint64(s.PendingBytes)))
		if s.Pending > 0 {
			fmt.Fprintf(w, "oldest:\tseq %d, enqueued %s\n", s.FirstSeq, when(s.Oldest, now))
			fmt.Fprintf(w, "newest:\tseq %d, enqueued %s\n", s.LastSeq, when(s.Newest, now))
		}
		// The stored ID is a fallback: a configured client_id replaces it.
		fmt.Fprintf(w, "client id:\t%s (stored in the file; used only while the output's client_id is empty)\n", s.ClientID)
		fmt.Fprintf(w, "set aside:\t%s\n", aside)
		fmt.Fprintf(w, "format:\t%s\n", formatLine(s.Format))
		fmt.Fprintf(w, "verified:\t%s\n", verified)
		return w.Flush()
	})
}

type recordJSON struct {
	Seq           uint64          `json:"seq"`
	EventID       string          `json:"event_id"`
	Topic         string          `json:"topic"`
	Properties    json.RawMessage `json:"mqtt5_properties,omitempty"` // what the record publishes with MQTT 5
	Enqueued      time.Time       `json:"enqueued"`
	Size          int             `json:"size"`
	Payload       *string         `json:"payload,omitempty"`        // the payload, when it is UTF-8
	PayloadBase64 string          `json:"payload_base64,omitempty"` // otherwise
	SetAside      string          `json:"set_aside,omitempty"`      // a set-aside record: readable, checksum, newer format, unreadable
	Reason        string          `json:"reason,omitempty"`         // why, for a set-aside record
}

func toJSON(r outbox.Record, withPayload bool) recordJSON {
	j := recordJSON{Seq: r.Seq, EventID: r.EventID, Enqueued: r.Enqueued.UTC(), Size: len(r.Payload)}
	j.Topic, j.Properties = r.Topic, outbox.PropertiesJSON(r.Props)
	if !withPayload {
		return j
	}
	if utf8.Valid(r.Payload) {
		s := string(r.Payload)
		j.Payload = &s
	} else {
		j.PayloadBase64 = base64.StdEncoding.EncodeToString(r.Payload)
	}
	return j
}

// errStop ends an Each early.
var errStop = errors.New("stop")

func outboxList(c *cli.Context) error {
	limit := c.Int("limit")
	if limit < 0 {
		return fmt.Errorf("outbox list: --limit must not be negative, got %d", limit)
	}
	return outboxView(c, func(path string, tx *bolt.Tx) error {
		out := bufio.NewWriter(c.App.Writer)
		defer out.Flush()
		asJSON := c.Bool("json")
		now := time.Now()
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		if !asJSON {
			fmt.Fprintln(w, "SEQ\tEVENT ID\tTOPIC\tSIZE\tAGE")
		}
		n := 0
		err := outbox.Each(tx, path, c.Uint64("after"), func(r outbox.Record, err error) error {
			if limit > 0 && n == limit {
				return errStop
			}
			n++
			if err != nil {
				if asJSON {
					return err // a script must not mistake a gap for the end
				}
				label := "damaged"
				if format.IsNewer(err) {
					label = "newer format"
				}
				fmt.Fprintf(w, "%d\t(%s: %v)\t\t\t\n", r.Seq, label, err)
				return nil
			}
			if asJSON {
				return writeJSONLine(out, toJSON(r, false))
			}
			_, err = fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\n", r.Seq, r.EventID, r.Topic, len(r.Payload), now.Sub(r.Enqueued).Round(time.Millisecond))
			return err
		})
		if err != nil && !errors.Is(err, errStop) {
			return err
		}
		if err := listAside(tx, path, w, out, asJSON); err != nil {
			return err
		}
		if !asJSON {
			return w.Flush()
		}
		return nil
	})
}

// listAside follows the pending records with the set-aside ones, each with
// its reason (JSON: "set_aside" and "reason" tell them from pending ones).
func listAside(tx *bolt.Tx, path string, w, out io.Writer, asJSON bool) error {
	first := true
	return outbox.EachAside(tx, path, func(a outbox.AsideRecord) error {
		if asJSON {
			j := recordJSON{Seq: a.Seq, Size: a.Size, SetAside: a.Kind.String(), Reason: a.Reason}
			if a.Kind == outbox.AsideReadable {
				j = toJSON(a.Record, false)
				j.SetAside, j.Reason = a.Kind.String(), a.Reason
			}
			return writeJSONLine(out, j)
		}
		if first {
			fmt.Fprintln(w, "\nset aside, never published:\nSEQ\tEVENT ID\tTOPIC\tSIZE\tREASON")
			first = false
		}
		_, err := fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s: %s\n", a.Seq, a.Record.EventID, a.Record.Topic, len(a.Record.Payload), a.Kind, a.Reason)
		return err
	})
}

// formatLine shows an outbox's format marker.
func formatLine(v uint64) string {
	if v == 0 {
		return fmt.Sprintf("none yet (written before format markers; read as version %d, marked at the next start)", outbox.Format)
	}
	return fmt.Sprintf("version %d (this build reads 1 to %d)", v, outbox.Format)
}

// outboxRestore puts the readable set-aside records back (outbox.Restore).
func outboxRestore(c *cli.Context) error {
	path, err := fileArg(c)
	if err != nil {
		return err
	}
	r, err := outbox.Restore(path)
	if errors.Is(err, boltfile.ErrLocked) {
		return fmt.Errorf("outbox restore: %s is locked by another process (a running reliable-mqtt?): restore needs the file to itself, since a running output has read past the sequence numbers it puts back; stop that process and run restore again; nothing restored", path)
	}
	if err != nil {
		return fmt.Errorf("outbox restore: %w", err)
	}
	w := c.App.Writer
	seqs := make([]string, len(r.Seqs))
	for i, s := range r.Seqs {
		seqs[i] = fmt.Sprint(s)
	}
	fmt.Fprintf(w, "restored %d records to the queue of %s under their original sequence numbers (%s); they are sent in FIFO order at the next start\n", len(r.Seqs), path, strings.Join(seqs, ", "))
	var kept setAside
	for _, a := range r.Kept {
		kept.add(a.Kind)
		fmt.Fprintf(w, "kept set aside: seq %d (%d bytes): %s: %s\n", a.Seq, a.Size, a.Kind, a.Reason)
	}
	fmt.Fprintf(w, "still set aside: %s\n", kept)
	return nil
}

// writeJSONLine writes v as one line, payload characters unescaped.
func writeJSONLine(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func outboxExport(c *cli.Context) (err error) {
	// Records that cannot be read are skipped, so the export salvages
	// everything else, and reported at the end (the first 100 by seq).
	var damaged []string
	ndamaged := 0
	var dst io.Writer = c.App.Writer
	if name := c.Path("output"); name != "" {
		// Never overwrite: the file may be an earlier export of records
		// since purged.
		f, ferr := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if ferr != nil {
			return fmt.Errorf("outbox export: %w (choose a new file name)", ferr)
		}
		defer func() {
			// On disk before it returns: an export is what an operator
			// keeps before a purge, whose removal is fsync'd.
			if serr := f.Sync(); serr != nil && err == nil {
				err = fmt.Errorf("outbox export: %w", serr)
			}
			if cerr := f.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("outbox export: %w", cerr)
			}
			// An export cut short must not pass for a complete one; one
			// that only skipped damaged records says so and stays.
			if err != nil && len(damaged) == 0 {
				_ = os.Remove(name)
			}
		}()
		dst = f
	}
	out := bufio.NewWriterSize(dst, 1<<16)
	n := 0
	err = outboxView(c, func(path string, tx *bolt.Tx) error {
		s, err := outbox.Summarize(tx, path)
		if err != nil {
			return err
		}
		var bar *progressbar.ProgressBar
		if s.Pending > progressThreshold && term.IsTerminal(int(os.Stderr.Fd())) {
			bar = progressbar.NewOptions(s.Pending, progressbar.OptionSetWriter(os.Stderr),
				progressbar.OptionSetDescription("exporting"), progressbar.OptionShowCount(),
				progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
			defer bar.Finish()
		}
		return outbox.Each(tx, path, 0, func(r outbox.Record, err error) error {
			if err != nil {
				fmt.Fprintf(c.App.ErrWriter, "outbox export: skipping: %v\n", err)
				if ndamaged++; len(damaged) < 100 {
					damaged = append(damaged, fmt.Sprint(r.Seq))
				}
				return nil
			}
			if err := writeJSONLine(out, toJSON(r, true)); err != nil {
				return fmt.Errorf("outbox export: writing record seq %d: %w", r.Seq, err)
			}
			n++
			if bar != nil {
				_ = bar.Add(1)
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("outbox export: %w", err)
	}
	fmt.Fprintf(c.App.ErrWriter, "exported %d records\n", n)
	if len(damaged) > 0 {
		return cli.Exit(fmt.Sprintf("outbox export: %d damaged records could not be read and are not in the export (seq %s); every other record is", ndamaged, strings.Join(damaged, ", ")), 1)
	}
	return nil
}

// purgeTarget is a record purge found to remove.
type purgeTarget struct {
	Seq      uint64
	EventID  string
	Topic    string
	Enqueued time.Time
}

func outboxPurge(c *cli.Context) error {
	ids, olderThan := c.StringSlice("event-id"), c.Duration("older-than")
	if (len(ids) == 0) == (olderThan == 0) {
		return errors.New("outbox purge: name what to remove with --event-id ID (repeatable) or --older-than DURATION, not both")
	}
	if olderThan < 0 {
		return fmt.Errorf("outbox purge: --older-than must be positive, got %s", olderThan)
	}
	var targets []purgeTarget
	var path string
	cutoff := time.Now().Add(-olderThan)
	err := outboxView(c, func(p string, tx *bolt.Tx) error {
		path = p
		if len(ids) > 0 {
			return findByEventID(tx, path, ids, &targets)
		}
		return outbox.Each(tx, path, 0, func(r outbox.Record, err error) error {
			if err != nil {
				return fmt.Errorf("outbox purge: %w; nothing removed", err)
			}
			if r.Enqueued.Before(cutoff) {
				targets = append(targets, purgeTarget{r.Seq, r.EventID, r.Topic, r.Enqueued})
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	w := c.App.Writer
	if !c.Bool("yes") {
		for _, t := range targets {
			fmt.Fprintf(w, "would remove seq %d, event ID %s, topic %s, enqueued %s\n", t.Seq, t.EventID, t.Topic, t.Enqueued.UTC().Format(time.RFC3339Nano))
		}
		return cli.Exit(fmt.Sprintf("outbox purge: %d records match; nothing removed: add --yes to remove them for good (they will never be delivered)", len(targets)), 1)
	}
	if len(targets) == 0 {
		fmt.Fprintln(w, "outbox purge: no record matches; nothing removed")
		return nil
	}
	return removeTargets(c, path, targets)
}

// findByEventID resolves every named event ID to its pending record. An ID
// that is not pending fails the whole purge: it removes exactly what it
// names or nothing.
func findByEventID(tx *bolt.Tx, path string, ids []string, targets *[]purgeTarget) error {
	var bySeq = map[uint64]bool{}
	for _, id := range ids {
		seq, ok, err := outbox.SeqOf(tx, path, id)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("outbox purge: event ID %q is not pending in %s; nothing removed", id, path)
		}
		if !bySeq[seq] {
			bySeq[seq] = true
			*targets = append(*targets, purgeTarget{Seq: seq, EventID: id})
		}
	}
	return outbox.Each(tx, path, 0, func(r outbox.Record, err error) error {
		if !bySeq[r.Seq] {
			return nil
		}
		if err != nil {
			return fmt.Errorf("outbox purge: %w; nothing removed", err)
		}
		for i := range *targets {
			if (*targets)[i].Seq == r.Seq {
				(*targets)[i].Topic = r.Topic
				(*targets)[i].Enqueued = r.Enqueued
			}
		}
		return nil
	})
}

// removeTargets opens the outbox read-write and removes the targets
// through Remove, logging each one.
func removeTargets(c *cli.Context, path string, targets []purgeTarget) error {
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		return fmt.Errorf("outbox purge: %w; nothing removed", err)
	}
	before := ob.Stats().Pending
	seqs := make([]uint64, len(targets))
	for i, t := range targets {
		seqs[i] = t.Seq
	}
	rmErr := ob.Remove(seqs...)
	after := ob.Stats().Pending
	if err := ob.Close(); err != nil && rmErr == nil {
		rmErr = err
	}
	if rmErr != nil {
		return fmt.Errorf("outbox purge: %w; nothing removed", rmErr)
	}
	log := slog.New(slog.NewTextHandler(c.App.ErrWriter, nil))
	for _, t := range targets {
		log.Info("outbox purge: removed record", "file", path, "seq", t.Seq, "event_id", t.EventID,
			"topic", t.Topic, "enqueued", t.Enqueued.UTC().Format(time.RFC3339Nano), "user", os.Getenv("USER"))
	}
	fmt.Fprintf(c.App.Writer, "removed %d records from %s; %d pending\n", before-after, path, after)
	if before-after != len(targets) {
		return fmt.Errorf("outbox purge: asked to remove %d records but %d went: the rest had left the outbox meanwhile", len(targets), before-after)
	}
	return nil
}
