package inspect

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledgerclock"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
)

// run runs the binary's inspection commands with args as a user would
// (`reliable-mqtt outbox stat FILE`), returning what they print and the
// exit code the CLI would end with.
func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	app := &cli.App{
		Name:           "reliable-mqtt",
		Writer:         &out,
		ErrWriter:      &errOut,
		Commands:       []*cli.Command{OutboxCommand(), LedgerCommand()},
		ExitErrHandler: func(*cli.Context, error) {}, // report, do not os.Exit
	}
	err := app.Run(append([]string{"reliable-mqtt"}, args...))
	var exit cli.ExitCoder
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
		errOut.WriteString(err.Error())
	case err != nil:
		code = 1
		errOut.WriteString(err.Error())
	}
	return out.String(), errOut.String(), code
}

// squash turns the runs of spaces a tabwriter aligns with into one.
func squash(s string) string { return spaces.ReplaceAllString(s, " ") }

var spaces = regexp.MustCompile(` +`)

// outboxFile writes an outbox with three records through the outbox's own
// code: one with MQTT 5 properties and one whose payload is not UTF-8.
func outboxFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outbox.db")
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	props := &mqttmsg.Properties{User: []mqttmsg.UserProperty{{Key: "traceparent", Value: "00-abc-01"}}, ContentType: "text/plain"}
	for _, e := range []outbox.Entry{
		{Event: mqttmsg.Event{EventID: "ev-1", Topic: "a/b", Payload: []byte(`{"n":1}`)}},
		{Event: mqttmsg.Event{EventID: "ev-2", Topic: "a/c", Props: props, Payload: []byte("two")}},
		{Event: mqttmsg.Event{EventID: "ev-3", Topic: "a/d", Payload: []byte{0xff, 0x00}}},
	} {
		if _, err := ob.Append(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestOutboxStatReportsTheBacklogAndVerifies(t *testing.T) {
	path := outboxFile(t)
	out, errOut, code := run(t, "outbox", "stat", path)
	if code != 0 || !strings.Contains(squash(out), "pending: 3 records") || !strings.Contains(out, "every page read") {
		t.Fatalf("outbox stat: exit %d\n%s%s", code, out, errOut)
	}
	out, _, code = run(t, "outbox", "stat", path, "--json") // flags after the file, as the usage shows
	var st outboxStatJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		t.Fatalf("outbox stat --json: exit %d, %v\n%s", code, err, out)
	}
	if st.Pending != 3 || st.FirstSeq != 1 || st.LastSeq != 3 || st.Damaged != 0 || !strings.HasPrefix(st.ClientID, "reliable-mqtt-") || st.File != path {
		t.Fatalf("outbox stat --json: %+v", st)
	}
}

func TestOutboxListAndExportShowEveryRecord(t *testing.T) {
	path := outboxFile(t)
	out, _, code := run(t, "outbox", "list", path)
	if code != 0 || strings.Count(out, "\n") != 4 || !strings.Contains(out, "ev-2") || !strings.Contains(out, "a/c") {
		t.Fatalf("outbox list: exit %d\n%s", code, out)
	}
	out, _, code = run(t, "outbox", "list", "--limit", "1", "--after", "1", "--json", path)
	var r recordJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 || strings.Count(out, "\n") != 1 {
		t.Fatalf("outbox list --limit 1 --after 1 --json: exit %d, %v\n%s", code, err, out)
	}
	if r.Seq != 2 || r.EventID != "ev-2" || r.Topic != "a/c" || string(r.Properties) != `{"user":[["traceparent","00-abc-01"]],"content_type":"text/plain"}` || r.Payload != nil {
		t.Fatalf("listed %+v (properties %s)", r, r.Properties)
	}

	out, _, code = run(t, "outbox", "export", path)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 {
		t.Fatalf("outbox export: exit %d\n%s", code, out)
	}
	var first, last recordJSON
	if json.Unmarshal([]byte(lines[0]), &first) != nil || json.Unmarshal([]byte(lines[2]), &last) != nil {
		t.Fatalf("outbox export is not JSON lines:\n%s", out)
	}
	if first.Payload == nil || *first.Payload != `{"n":1}` || last.PayloadBase64 != "/wA=" || last.Size != 2 {
		t.Fatalf("exported payloads: %+v, %+v", first, last)
	}
	// --output refuses a file that exists: an export never overwrites.
	target := filepath.Join(t.TempDir(), "export.jsonl")
	if _, _, code := run(t, "outbox", "export", path, "-o", target); code != 0 {
		t.Fatalf("export -o: exit %d", code)
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != out {
		t.Fatalf("export -o wrote %q (%v), want what stdout got", b, err)
	}
	if _, errOut, code := run(t, "outbox", "export", path, "-o", target); code == 0 || errOut == "" {
		t.Fatal("export -o over an existing file succeeded")
	}
}

func TestOutboxPurgeRemovesOnlyWithYes(t *testing.T) {
	path := outboxFile(t)
	out, errOut, code := run(t, "outbox", "purge", "--event-id", "ev-2", path)
	if code != 1 || !strings.Contains(out, "would remove seq 2, event ID ev-2, topic a/c") || !strings.Contains(errOut, "nothing removed") {
		t.Fatalf("purge without --yes: exit %d\n%s%s", code, out, errOut)
	}
	if _, errOut, code := run(t, "outbox", "purge", "--event-id", "nope", "--yes", path); code == 0 || !strings.Contains(errOut, `"nope" is not pending`) {
		t.Fatalf("purge of an unknown event ID: exit %d, %s", code, errOut)
	}
	if _, errOut, code := run(t, "outbox", "purge", path); code == 0 || !strings.Contains(errOut, "--event-id") {
		t.Fatalf("purge naming nothing: exit %d, %s", code, errOut)
	}
	if _, errOut, code := run(t, "outbox", "purge", "--event-id", "ev-2", "--yes", path); code != 0 {
		t.Fatalf("purge --yes: exit %d, %s", code, errOut)
	}
	out, _, _ = run(t, "outbox", "list", "--json", path)
	if strings.Count(out, "\n") != 2 || strings.Contains(out, "ev-2") {
		t.Fatalf("after the purge:\n%s", out)
	}
}

func TestLedgerStatAndLookup(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	// A ledger started by a wall clock at 1970: its times are "ago" from
	// its own clock, not from today's wall clock.
	f := ledgerclock.NewFake(time.Date(1970, 1, 2, 0, 0, 0, 0, time.UTC))
	l, err := ledger.Open(path, ledger.Options{Clock: f.Source()})
	if err != nil {
		t.Fatal(err)
	}
	hash := sha256.Sum256([]byte("payload"))
	c, v, err := l.Claim(context.Background(), claims.Key{Namespace: "p", ID: "ev-1"}, hash, time.Second)
	if err != nil || v != claims.Pass {
		t.Fatalf("claim: %v %v", v, err)
	}
	if err := c.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.Pass(10 * time.Minute)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	out, errOut, code := run(t, "ledger", "stat", path)
	if code != 0 || !strings.Contains(squash(out), "applied keys: 1\n") || !strings.Contains(out, "entries pass their checksums") ||
		!strings.Contains(squash(out), "ledger clock: 1970-01-02T00:10:00Z") || !strings.Contains(out, "(10 minutes ago)") {
		t.Fatalf("ledger stat: exit %d\n%s%s", code, out, errOut)
	}
	out, _, code = run(t, "ledger", "lookup", "--namespace", "p", "--json", path, "ev-1")
	var got lookupJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 {
		t.Fatalf("ledger lookup --json: exit %d, %v\n%s", code, err, out)
	}
	if !got.Applied || got.Hash != hex.EncodeToString(hash[:]) || got.At == nil {
		t.Fatalf("lookup of an applied key: %+v", got)
	}
	out, _, code = run(t, "ledger", "lookup", path, "ev-1") // another namespace
	if code != 0 || !strings.Contains(out, `key "ev-1": not applied`) {
		t.Fatalf("lookup without the namespace: exit %d\n%s", code, out)
	}
}

func TestCommandsRefuseWhatTheyCannotRead(t *testing.T) {
	dir := t.TempDir()
	if _, errOut, code := run(t, "outbox", "stat"); code == 0 || !strings.Contains(errOut, "expected one FILE argument") {
		t.Fatalf("stat without a file: exit %d, %s", code, errOut)
	}
	missing := filepath.Join(dir, "missing.db")
	if _, _, code := run(t, "outbox", "list", missing); code == 0 {
		t.Fatal("list of a missing file succeeded")
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Fatalf("a read-only command created %s", missing)
	}
	sqlite := filepath.Join(dir, "ledger.sqlite")
	if err := os.WriteFile(sqlite, append([]byte(sqliteMagic), make([]byte, 100)...), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := run(t, "ledger", "stat", sqlite); code == 0 || !strings.Contains(errOut, "is a SQLite database, not a bbolt file") {
		t.Fatalf("ledger stat of a SQLite file: exit %d, %s", code, errOut)
	}
	// An outbox file is not a ledger.
	path := outboxFile(t)
	if _, errOut, code := run(t, "ledger", "stat", path); code == 0 || errOut == "" {
		t.Fatalf("ledger stat of an outbox: exit %d", code)
	}
}
