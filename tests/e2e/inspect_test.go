package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// cliResult is one run of the real binary.
type cliResult struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// inspectCLI runs `reliable-mqtt args...` and returns its output and exit
// code, whatever the code.
func inspectCLI(t *testing.T, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, harness.Binary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := cliResult{stdout.String(), stderr.String(), 0, time.Since(start)}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("reliable-mqtt %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("reliable-mqtt %s did not finish within 60s", strings.Join(args, " "))
	}
	return r
}

// mustCLI is inspectCLI that fails the test unless the exit code is 0.
func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	r := inspectCLI(t, args...)
	if r.code != 0 {
		t.Fatalf("reliable-mqtt %s exited %d:\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// fillOutbox appends n records offline (no broker, nothing drains them)
// with the outbox the output uses, from workers goroutines. Record i has
// event ID ev-i and topic t/i; payload(i) gives its payload.
func fillOutbox(t *testing.T, path string, from, n, workers int, payload func(i int) []byte) {
	t.Helper()
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ob.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	next := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				e := outbox.Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("ev-%d", i), Topic: fmt.Sprintf("t/%d", i), Payload: payload(i)}}
				if _, err := ob.Append(context.Background(), e); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := from; i < from+n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func textPayload(i int) []byte {
	return []byte(fmt.Sprintf(`{"reading":%d,"note":"<&> ünïcode"}`, i))
}

// binaryPayload: every 7th record is not UTF-8.
func binaryPayload(i int) []byte {
	if i%7 == 0 {
		return []byte{0xff, 0xfe, byte(i), byte(i >> 8), 0x00, 0x80}
	}
	return textPayload(i)
}

type statJSON struct {
	Pending      int    `json:"pending"`
	PendingBytes int64  `json:"pending_bytes"`
	FirstSeq     uint64 `json:"first_seq"`
	LastSeq      uint64 `json:"last_seq"`
	ClientID     string `json:"client_id"`
	Oldest       *time.Time
	Newest       *time.Time
}

func outboxStatJSON(t *testing.T, path string) statJSON {
	t.Helper()
	var s statJSON
	out := mustCLI(t, "outbox", "stat", path, "--json")
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("outbox stat --json printed %q: %v", out, err)
	}
	return s
}

func TestOutboxStatAndListThroughTheBinary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	before := time.Now()
	fillOutbox(t, path, 1, 500, 1, textPayload)
	after := time.Now()

	if help := mustCLI(t, "outbox", "stat", "--help"); !strings.Contains(help, "reliable-mqtt outbox stat FILE") {
		t.Fatalf("outbox stat --help:\n%s", help)
	}
	text := mustCLI(t, "outbox", "stat", path)
	if !strings.Contains(text, "pending:    500 records") {
		t.Fatalf("outbox stat does not print 500 pending:\n%s", text)
	}
	s := outboxStatJSON(t, path)
	wantBytes := int64(0)
	for i := 1; i <= 500; i++ {
		wantBytes += int64(len(fmt.Sprintf("ev-%d", i)) + len(fmt.Sprintf("t/%d", i)) + len(textPayload(i)))
	}
	if s.Pending != 500 || s.PendingBytes != wantBytes || s.FirstSeq != 1 || s.LastSeq != 500 {
		t.Fatalf("stat --json: %+v; want 500 pending, %d bytes, seqs 1..500", s, wantBytes)
	}
	if s.Oldest == nil || s.Newest == nil || s.Oldest.Before(before.Add(-time.Second)) || s.Newest.After(after.Add(time.Second)) || s.Newest.Before(*s.Oldest) {
		t.Fatalf("stat --json: oldest %v, newest %v outside the fill (%v .. %v)", s.Oldest, s.Newest, before, after)
	}
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := ob.ClientID()
	ob.Close()
	if s.ClientID != id || !strings.Contains(text, id) {
		t.Fatalf("stat shows client ID %q, the outbox's is %q", s.ClientID, id)
	}
	// The stored ID is a fallback; the line says so, since a process with
	// client_id set connects under that name instead.
	if !strings.Contains(text, "client id:  "+id+" (stored in the file; used only while the output's client_id is empty)") {
		t.Fatalf("stat does not say when the stored client ID applies:\n%s", text)
	}

	list := strings.Split(strings.TrimSpace(mustCLI(t, "outbox", "list", path, "--after", "10", "--limit", "3")), "\n")
	if len(list) != 4 {
		t.Fatalf("list --after 10 --limit 3 printed %d lines:\n%s", len(list), strings.Join(list, "\n"))
	}
	for i, line := range list[1:] {
		f := strings.Fields(line)
		seq := 11 + i
		if len(f) != 5 || f[0] != fmt.Sprint(seq) || f[1] != fmt.Sprintf("ev-%d", seq) || f[2] != fmt.Sprintf("t/%d", seq) || f[3] != fmt.Sprint(len(textPayload(seq))) {
			t.Errorf("list line %q, want seq %d, ev-%d, t/%d, %d bytes, age", line, seq, seq, seq, len(textPayload(seq)))
		}
	}
	var n int
	sc := bufio.NewScanner(strings.NewReader(mustCLI(t, "outbox", "list", path, "--limit", "0", "--json")))
	for sc.Scan() {
		var r struct {
			Seq     uint64 `json:"seq"`
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("list --json line %q: %v", sc.Text(), err)
		}
		n++
		if r.Seq != uint64(n) || r.EventID != fmt.Sprintf("ev-%d", n) {
			t.Fatalf("list --json line %d is seq %d %s, want FIFO order", n, r.Seq, r.EventID)
		}
	}
	if n != 500 {
		t.Fatalf("list --limit 0 --json listed %d records, want 500", n)
	}
}

// The real binary fills an outbox while its broker is unreachable and
// stops when its input ends; stat then reads all 500 records.
func TestOutboxStatOfAnOutboxTheBinaryFilledOffline(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "offline.db")
	p := harness.RunPipeline(t, fmt.Sprintf(`
http: {enabled: false}
input:
  generate: {count: 500, interval: "", mapping: 'root = {"n": counter()}'}
output:
  reliable_mqtt_out:
    urls: [ "tcp://127.0.0.1:1" ]
    topic: readings
    outbox: {path: %q}
`, path), harness.ProcOptions{})
	if code, err := p.Wait(60 * time.Second); err != nil || code != 0 {
		t.Fatalf("the offline run: exit %d, %v", code, err)
	}
	if out := mustCLI(t, "outbox", "stat", path); !strings.Contains(out, "pending:    500 records") {
		t.Fatalf("outbox stat after 500 offline writes:\n%s", out)
	}
}

// Every record of a 100k outbox comes out of export exactly as it went in,
// including payloads that are not UTF-8.
func TestOutboxExportRoundTrips100kRecords(t *testing.T) {
	const n = 100_000
	dir := t.TempDir()
	path := filepath.Join(dir, "outbox.db")
	fillOutbox(t, path, 0, n, 64, binaryPayload)

	out := filepath.Join(dir, "export.jsonl")
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := inspectCLI(t, "outbox", "export", path, "-o", out)
	if r.code != 0 || !strings.Contains(r.stderr, fmt.Sprintf("exported %d records", n)) {
		t.Fatalf("export exited %d: %s%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("export of %d records took %s", n, r.took)
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := make([]bool, n)
	var lastSeq uint64
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	lines := 0
	for sc.Scan() {
		lines++
		var rec struct {
			Seq           uint64    `json:"seq"`
			EventID       string    `json:"event_id"`
			Topic         string    `json:"topic"`
			Enqueued      time.Time `json:"enqueued"`
			Payload       *string   `json:"payload"`
			PayloadBase64 string    `json:"payload_base64"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("line %d %q: %v", lines, sc.Text(), err)
		}
		var i int
		if _, err := fmt.Sscanf(rec.EventID, "ev-%d", &i); err != nil || i < 0 || i >= n || seen[i] {
			t.Fatalf("line %d: unexpected or repeated event ID %q", lines, rec.EventID)
		}
		seen[i] = true
		if rec.Seq <= lastSeq {
			t.Fatalf("line %d: seq %d after %d: not FIFO order", lines, rec.Seq, lastSeq)
		}
		lastSeq = rec.Seq
		var payload []byte
		if rec.Payload != nil {
			payload = []byte(*rec.Payload)
		} else if payload, err = base64.StdEncoding.DecodeString(rec.PayloadBase64); err != nil {
			t.Fatalf("line %d: payload_base64: %v", lines, err)
		}
		if rec.Topic != fmt.Sprintf("t/%d", i) || !bytes.Equal(payload, binaryPayload(i)) || rec.Enqueued.IsZero() {
			t.Fatalf("line %d: %s has topic %q payload %q, want t/%d %q", lines, rec.EventID, rec.Topic, payload, i, binaryPayload(i))
		}
		if (rec.Payload == nil) != (i%7 == 0) {
			t.Fatalf("line %d: %s: payload as base64 = %v, want it only for non-UTF-8", lines, rec.EventID, rec.Payload == nil)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if lines != n {
		t.Fatalf("export wrote %d lines, want %d", lines, n)
	}
	// Exporting reads only: the file is byte for byte what it was.
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("export changed the outbox file")
	}
	if r := inspectCLI(t, "outbox", "export", path, "-o", out); r.code == 0 || !strings.Contains(r.stderr, "file exists") {
		t.Fatalf("export over an existing file: exit %d, %s", r.code, r.stderr)
	}
}

// pendingIDs lists the event IDs left in the outbox, in order.
func pendingIDs(t *testing.T, path string) []string {
	t.Helper()
	var ids []string
	sc := bufio.NewScanner(strings.NewReader(mustCLI(t, "outbox", "list", path, "--limit", "0", "--json")))
	for sc.Scan() {
		var r struct {
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.EventID)
	}
	return ids
}

func TestOutboxPurgeRemovesExactlyWhatItNames(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "outbox.db")
	fillOutbox(t, path, 1, 20, 1, textPayload)
	all := pendingIDs(t, path)

	// Without --yes: shown, refused, nothing removed.
	r := inspectCLI(t, "outbox", "purge", path, "--event-id", "ev-7", "--event-id", "ev-9")
	if r.code != 1 || !strings.Contains(r.stderr, "add --yes") || strings.Count(r.stdout, "would remove") != 2 {
		t.Fatalf("purge without --yes: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := pendingIDs(t, path); len(got) != 20 {
		t.Fatalf("purge without --yes removed records: %d left", len(got))
	}
	// An ID that is not pending fails the whole purge.
	r = inspectCLI(t, "outbox", "purge", path, "--event-id", "ev-7", "--event-id", "nope", "--yes")
	if r.code == 0 || !strings.Contains(r.stderr, `event ID "nope" is not pending`) {
		t.Fatalf("purge of an unknown ID: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := pendingIDs(t, path); len(got) != 20 {
		t.Fatalf("a refused purge removed records: %d left", len(got))
	}

	r = inspectCLI(t, "outbox", "purge", path, "--event-id", "ev-7", "--event-id", "ev-9", "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, "removed 2 records") {
		t.Fatalf("purge --yes: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, id := range []string{"ev-7", "ev-9"} {
		logged := false
		for _, line := range strings.Split(r.stderr, "\n") {
			if strings.Contains(line, `msg="outbox purge: removed record"`) && strings.Contains(line, " event_id="+id+" ") &&
				strings.Contains(line, " seq=") && strings.Contains(line, " topic=t/") && strings.Contains(line, " enqueued=20") {
				logged = true
			}
		}
		if !logged {
			t.Errorf("the removal of %s is not logged with seq, event ID, topic and enqueue time:\n%s", id, r.stderr)
		}
	}
	var want []string
	for _, id := range all {
		if id != "ev-7" && id != "ev-9" {
			want = append(want, id)
		}
	}
	if got := pendingIDs(t, path); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("after purging ev-7 and ev-9:\n got %v\nwant %v", got, want)
	}
	if s := outboxStatJSON(t, path); s.Pending != 18 {
		t.Fatalf("stat after purge: %d pending, want 18", s.Pending)
	}

	// --older-than: records enqueued before a gap go, the ones after stay.
	// The binary reads its clock somewhere between exec and exit; with the
	// cutoff aimed at the middle of the gap, the outcome is fixed only if
	// that window is shorter than half the gap. A purge that took longer
	// (a loaded machine) is repeated on a new file with a longer gap.
	gap := 2 * time.Second
	for attempt := 1; ; attempt++ {
		old := filepath.Join(dir, fmt.Sprintf("old-%d.db", attempt))
		fillOutbox(t, old, 1, 5, 1, textPayload)
		lastOld := time.Now()
		time.Sleep(gap)
		fillOutbox(t, old, 6, 5, 1, textPayload)
		start := time.Now()
		olderThan := start.Sub(lastOld.Add(gap / 2))
		r = inspectCLI(t, "outbox", "purge", old, "--older-than", olderThan.String(), "--yes")
		took := time.Since(start)
		if r.code != 0 {
			t.Fatalf("purge --older-than: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		if took < gap/2 {
			if got := strings.Join(pendingIDs(t, old), " "); got != "ev-6 ev-7 ev-8 ev-9 ev-10" {
				t.Fatalf("after purge --older-than the middle of a %s gap: %s", gap, got)
			}
			break
		}
		if attempt == 6 {
			t.Fatalf("purge --older-than took %s, more than half of a %s gap, %d times: cannot tell where its cutoff fell", took, gap, attempt)
		}
		t.Logf("purge --older-than took %s, more than half of a %s gap: again with a longer gap", took, gap)
		gap = 4 * took
	}
}

// A file held by a running process is reported, not waited for, and the
// message points at the live metrics.
func TestInspectingALockedFileFailsFastWithAClearMessage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	holder := harness.RunPipeline(t, fmt.Sprintf(`
http: {enabled: false}
input:
  generate: {interval: 100ms, mapping: 'root = "x"'}
output:
  reliable_mqtt_out:
    urls: [ "tcp://127.0.0.1:1" ]
    topic: t
    outbox: {path: %q}
`, path), harness.ProcOptions{})
	harness.Eventually(t, 30*time.Second, "the process to hold its outbox's lock", func() bool {
		return holder.Running() && lockedByOther(t, path)
	})
	for _, args := range [][]string{
		{"outbox", "stat", path},
		{"outbox", "export", path, "-o", filepath.Join(filepath.Dir(path), "export.jsonl")},
		{"ledger", "stat", path},
		{"outbox", "purge", path, "--older-than", "1s", "--yes"},
	} {
		r := inspectCLI(t, args...)
		if r.code == 0 || !strings.Contains(r.stderr, "is locked by another process") || !strings.Contains(r.stderr, "/metrics") {
			t.Fatalf("%v on a locked file: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
		}
		t.Logf("%v on a locked file failed after %s", args, r.took)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(path), "export.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed export left its -o file behind (%v)", err)
	}
}

// lockedByOther reports whether another process holds the flock that
// bbolt takes on path: a shared lock, tried without waiting, is refused.
// (A lock this probe gets is released at once; bbolt's own open waits up
// to 2 s for it.)
func lockedByOther(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	if err == nil {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return false
	}
	if !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("flock %s: %v", path, err)
	}
	return true
}

// A foreign or damaged file gets the plugins' refusal and stays unchanged.
func TestInspectRefusesForeignAndDamagedFiles(t *testing.T) {
	dir := t.TempDir()
	foreign := filepath.Join(dir, "foreign.db")
	db, err := bolt.Open(foreign, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("app-data")); return err }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, bytes.Repeat([]byte("not a database "), 2000), 0o600); err != nil {
		t.Fatal(err)
	}
	ledgerOnly := filepath.Join(dir, "ledger.db")
	l, err := ledger.Open(ledgerOnly, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"outbox", "stat", foreign}, "not a reliable-mqtt file"},
		{[]string{"ledger", "stat", foreign}, "not a reliable-mqtt file"},
		{[]string{"outbox", "list", garbage}, "not a usable bbolt database"},
		{[]string{"outbox", "purge", garbage, "--older-than", "1s", "--yes"}, "not a usable bbolt database"},
		{[]string{"outbox", "stat", ledgerOnly}, "no outbox in this file"},
		{[]string{"outbox", "stat", filepath.Join(dir, "missing.db")}, "does not exist"},
	} {
		file := c.args[2]
		before, _ := os.ReadFile(file)
		r := inspectCLI(t, c.args...)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, want a refusal with %q:\n%s%s", c.args, r.code, c.want, r.stdout, r.stderr)
		}
		if after, _ := os.ReadFile(file); !bytes.Equal(before, after) {
			t.Errorf("%v changed the file", c.args)
		}
	}
}

func TestLedgerStatAndLookupThroughTheBinary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, err := ledger.Open(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"delta":1}`)
	hash := sha256.Sum256(payload)
	for i := range 25 {
		c, v, err := l.Claim(context.Background(), claims.Key{Namespace: "sensor-1", ID: fmt.Sprintf("ev-%d", i)}, hash, time.Second)
		if err != nil || v != claims.Pass {
			t.Fatalf("claim %d: verdict %v, %v", i, v, err)
		}
		if err := c.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	var s struct {
		Keys   int64      `json:"keys"`
		Oldest *time.Time `json:"oldest"`
	}
	if err := json.Unmarshal([]byte(mustCLI(t, "ledger", "stat", path, "--json")), &s); err != nil || s.Keys != 25 || s.Oldest == nil {
		t.Fatalf("ledger stat --json: %+v, %v; want 25 keys", s, err)
	}
	if out := mustCLI(t, "ledger", "stat", path); !strings.Contains(out, "applied keys:    25") {
		t.Fatalf("ledger stat:\n%s", out)
	}
	out := mustCLI(t, "ledger", "lookup", "--namespace", "sensor-1", path, "ev-3")
	if !strings.Contains(out, "applied 20") || !strings.Contains(out, hex.EncodeToString(hash[:])) {
		t.Fatalf("lookup of an applied key:\n%s", out)
	}
	// The namespace is part of the key.
	if out := mustCLI(t, "ledger", "lookup", path, "ev-3"); !strings.Contains(out, "not applied") {
		t.Fatalf("lookup without the namespace:\n%s", out)
	}
}

func TestLedgerStatAndLookupOnSQL(t *testing.T) {
	pg := harness.StartPostgres(t)
	dsns := map[sqlledger.Driver]string{
		sqlledger.SQLite:   filepath.Join(t.TempDir(), "ledger.sqlite"),
		sqlledger.Postgres: pg.DSN(),
	}
	for driver, dsn := range dsns {
		t.Run(string(driver), func(t *testing.T) {
			ctx := context.Background()
			s, err := sqlledger.Open(ctx, sqlledger.Config{Driver: driver, DSN: dsn, Table: "dedup_ledger"})
			if err != nil {
				t.Fatal(err)
			}
			keys := []claims.Key{{Namespace: "p", ID: "a"}, {Namespace: "p", ID: "b"}, {Namespace: "q", ID: "a"}}
			hashes := [][]byte{{1, 2}, {3, 4}, {5, 6}}
			if _, err := s.Record(ctx, keys, hashes); err != nil {
				t.Fatal(err)
			}
			s.Close()

			out := mustCLI(t, "ledger", "stat", "--driver", string(driver), "--dsn", dsn)
			if !strings.Contains(out, "applied keys:    3") {
				t.Fatalf("ledger stat:\n%s", out)
			}
			out = mustCLI(t, "ledger", "lookup", "--driver", string(driver), "--dsn", dsn, "--namespace", "p", "b")
			if !strings.Contains(out, "applied 20") || !strings.Contains(out, "0304") {
				t.Fatalf("lookup p/b:\n%s", out)
			}
			if out := mustCLI(t, "ledger", "lookup", "--driver", string(driver), "--dsn", dsn, "--namespace", "p", "zz"); !strings.Contains(out, "not applied") {
				t.Fatalf("lookup p/zz:\n%s", out)
			}
			// Only reads: a table that does not exist is an error, not created.
			r := inspectCLI(t, "ledger", "stat", "--driver", string(driver), "--dsn", dsn, "--table", "other")
			if r.code == 0 {
				t.Fatalf("stat of a missing table succeeded:\n%s", r.stdout)
			}
			db, err := sql.Open(map[sqlledger.Driver]string{sqlledger.SQLite: "sqlite", sqlledger.Postgres: "pgx"}[driver], dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var created bool
			q := map[sqlledger.Driver]string{
				sqlledger.SQLite:   `SELECT count(*) > 0 FROM sqlite_master WHERE name = 'other'`,
				sqlledger.Postgres: `SELECT to_regclass('other') IS NOT NULL`,
			}[driver]
			if err := db.QueryRow(q).Scan(&created); err != nil || created {
				t.Fatalf("stat of a missing table created it (%v, %v)", created, err)
			}
		})
	}
}

// Above 10,000 records export shows a progress bar on a terminal, and
// none when stderr is not one.
func TestOutboxExportShowsProgressOnATerminal(t *testing.T) {
	script, err := exec.LookPath("script") // util-linux: runs a command on a pty
	if err != nil {
		t.Skipf("no script(1) to provide a terminal: %v", err)
	}
	const n = 12_000
	dir := t.TempDir()
	path := filepath.Join(dir, "outbox.db")
	fillOutbox(t, path, 0, n, 64, textPayload)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmdline := fmt.Sprintf("%s outbox export %s -o %s", harness.Binary(t), path, filepath.Join(dir, "tty.jsonl"))
	onTTY, err := exec.CommandContext(ctx, script, "-qec", cmdline, "/dev/null").CombinedOutput()
	if err != nil {
		t.Fatalf("export on a pty: %v\n%s", err, onTTY)
	}
	if !strings.Contains(string(onTTY), "exporting") || !strings.Contains(string(onTTY), fmt.Sprintf("/%d", n)) {
		t.Fatalf("no progress bar on a terminal:\n%q", onTTY)
	}
	r := inspectCLI(t, "outbox", "export", path, "-o", filepath.Join(dir, "pipe.jsonl"))
	if r.code != 0 || strings.Contains(r.stderr, "exporting") {
		t.Fatalf("export to a pipe: exit %d, stderr %q", r.code, r.stderr)
	}
}

// A damaged record inside a healthy outbox is skipped and named; export
// salvages every other record and exits 1, list shows the gap.
func TestOutboxExportSkipsAndNamesADamagedRecord(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "outbox.db")
	fillOutbox(t, path, 1, 10, 1, textPayload)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		var k [8]byte
		k[7] = 4 // seq 4
		// version 0: no release wrote it (a newer version is not damage)
		return tx.Bucket([]byte("outbox/records")).Put(k[:], []byte{0x00, 0x01})
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	out := filepath.Join(dir, "salvage.jsonl")
	r := inspectCLI(t, "outbox", "export", path, "-o", out)
	if r.code != 1 || !strings.Contains(r.stderr, "1 damaged records could not be read and are not in the export (seq 4)") || !strings.Contains(r.stderr, "exported 9 records") {
		t.Fatalf("export with a damaged record: exit %d\n%s", r.code, r.stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("the salvage export is gone: %v", err)
	}
	if n := strings.Count(string(data), "\n"); n != 9 || strings.Contains(string(data), `"ev-4"`) {
		t.Fatalf("salvage export has %d lines:\n%s", n, data)
	}
	if list := mustCLI(t, "outbox", "list", path); !strings.Contains(list, "4    (damaged: ") {
		t.Fatalf("list does not show the damaged record:\n%s", list)
	}
	if r := inspectCLI(t, "outbox", "list", path, "--json"); r.code == 0 || !strings.Contains(r.stderr, "record seq 4") {
		t.Fatalf("list --json over a damaged record: exit %d, %s", r.code, r.stderr)
	}
}

// A SQL ledger named the way a bbolt one is (the README's form) is
// recognised and the error says which flags read it: a SQLite file, a
// PostgreSQL DSN, a table that is not the default.
func TestLedgerCommandsPointAtTheSQLFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "consumer.db")
	ctx := context.Background()
	s, err := sqlledger.Open(ctx, sqlledger.Config{Driver: sqlledger.SQLite, DSN: path, Table: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Record(ctx, []claims.Key{{Namespace: "sensor-1", ID: "ev-42"}}, [][]byte{{1}}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ledger", "lookup", path, "--namespace", "sensor-1", "ev-42"}, "is a SQLite database, not a bbolt file. A dedup_ledger with sql (driver: sqlite) is read with: reliable-mqtt ledger lookup --driver sqlite --dsn " + path},
		{[]string{"ledger", "stat", "--driver", "sqlite", "--dsn", path}, `--table names the ledger's sql.table; it is "dedup_ledger" now`},
		{[]string{"ledger", "lookup", "postgres://u@127.0.0.1:1/db", "ev-42"}, "is a PostgreSQL DSN, not a bbolt FILE: use --driver postgres --dsn DSN"},
	} {
		r := inspectCLI(t, c.args...)
		if r.code == 0 || !strings.Contains(r.stdout+r.stderr, c.want) {
			t.Errorf("reliable-mqtt %s: exit %d, want an error containing %q; got:\n%s%s", strings.Join(c.args, " "), r.code, c.want, r.stdout, r.stderr)
		}
	}
	if out := mustCLI(t, "ledger", "lookup", "--driver", "sqlite", "--dsn", path, "--table", "ledger", "--namespace", "sensor-1", "ev-42"); !strings.Contains(out, "applied 20") {
		t.Fatalf("lookup with the hinted flags:\n%s", out)
	}
}
