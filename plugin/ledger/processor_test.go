package ledger

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/dedup"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/streamtest"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// relay is a stream dedup_ledger → reliable_mqtt_out with the ledger and the
// outbox in one file, and a subscriber on the output topic.
type relay struct {
	*streamtest.Stream
	path string
	sub  *harness.Subscriber
}

func startRelay(t *testing.T, ledgerExtra, output string) *relay {
	t.Helper()
	mosq := harness.StartMosquitto(t, harness.MosquittoOptions{})
	sub := harness.Subscribe(t, mosq.URL(), "ledger-test-sub", true, "relayed/#")
	path := filepath.Join(t.TempDir(), "relay.db")
	out := fmt.Sprintf(`
reliable_mqtt_out:
  urls: [ %q ]
  topic: relayed/out
  event_id: ${! meta("event_id") }
  outbox:
    path: %s
`, mosq.URL(), path)
	if output != "" {
		out = strings.ReplaceAll(output, "OUTBOX", strings.ReplaceAll(strings.TrimPrefix(out, "\n"), "\n", "\n        "))
	}
	proc := fmt.Sprintf("dedup_ledger:\n  path: %s\n%s", path, ledgerExtra)
	return &relay{Stream: streamtest.Start(t, out, proc), path: path, sub: sub}
}

// deliver sends one message with delivery hooks, as reliable_mqtt_in
// would, and returns the pipeline's verdict and the hooks' result.
func (r *relay) deliver(payload string, meta ...string) (result, hookErr error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.Deliver(ctx, streamtest.Message(payload, meta...))
}

// sendPlain sends a message without hooks (any other input).
func (r *relay) sendPlain(payload string, meta ...string) error {
	return r.Write(10*time.Second, payload, meta...)
}

// seen waits until the sentinel payload arrived (publishing is FIFO, so
// every record enqueued before it was published before it) and returns
// how often payload was published.
func (r *relay) seen(t *testing.T, sentinel, payload string) int {
	t.Helper()
	if res, hookErr := r.deliver(sentinel, "event_id", "sentinel-"+sentinel); res != nil || hookErr != nil {
		t.Fatalf("sentinel: %v %v", res, hookErr)
	}
	eventually(t, 10*time.Second, "the sentinel at the subscriber", func() bool {
		return countOf(r.payloads(), sentinel) == 1
	})
	return countOf(r.payloads(), payload)
}

func (r *relay) payloads() [][]byte {
	var out [][]byte
	for _, m := range r.sub.Messages() {
		out = append(out, m.Payload)
	}
	return out
}

func (r *relay) lookup(t *testing.T, id string) bool {
	t.Helper()
	l, err := ledger.Open(r.path, ledger.Options{Retention: 168 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	applied, _, _, err := l.Lookup(claims.Key{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return applied
}

// rejectIfFail is a relay output that rejects messages with metadata
// fail: yes ("destination is down") and stores the rest in the outbox.
const rejectIfFail = `
switch:
  cases:
    - check: meta("fail") == "yes"
      output:
        reject: "destination is down"
    - output:
        OUTBOX`

func TestRelayEnqueuesEachEventIDOnce(t *testing.T) {
	r := startRelay(t, "", "")
	if res, hookErr := r.deliver(`{"delta":1}`, "event_id", "batch-42"); res != nil || hookErr != nil {
		t.Fatalf("first copy: %v %v", res, hookErr)
	}
	if !r.lookup(t, "batch-42") {
		t.Fatal("key not applied after the output stored the message")
	}
	// Redeliveries, one after another and then eight at once: each is
	// acknowledged (so the broker stops redelivering) and none is enqueued.
	if res, hookErr := r.deliver(`{"delta":1}`, "event_id", "batch-42"); res != nil || hookErr != nil {
		t.Fatalf("second copy: %v %v", res, hookErr)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, hookErr := r.deliver(`{"delta":1}`, "event_id", "batch-42"); res != nil || hookErr != nil {
				t.Errorf("concurrent copy: %v %v", res, hookErr)
			}
		}()
	}
	wg.Wait()
	if n := r.seen(t, "end", `{"delta":1}`); n != 1 {
		t.Fatalf("event batch-42 published %d times, want exactly 1", n)
	}
}

func TestFailedOutputDoesNotApplyKeyAndRetryPasses(t *testing.T) {
	r := startRelay(t, "", rejectIfFail)
	res, hookErr := r.deliver("p1", "event_id", "e1", "fail", "yes")
	if res == nil || !strings.Contains(res.Error(), "destination is down") {
		t.Fatalf("want the output's failure, got %v", res)
	}
	if hookErr != nil {
		t.Fatalf("a release must not fail the hook: %v", hookErr)
	}
	if r.lookup(t, "e1") {
		t.Fatal("key applied although the output failed")
	}
	// The retry passes and is enqueued; later copies are dropped.
	if res, hookErr := r.deliver("p1", "event_id", "e1"); res != nil || hookErr != nil {
		t.Fatalf("retry: %v %v", res, hookErr)
	}
	if res, hookErr := r.deliver("p1", "event_id", "e1"); res != nil || hookErr != nil {
		t.Fatalf("copy after retry: %v %v", res, hookErr)
	}
	if n := r.seen(t, "end", "p1"); n != 1 {
		t.Fatalf("e1 published %d times, want 1", n)
	}
}

func TestFlaggedDuplicateIsNotEnqueuedOnLedgerFile(t *testing.T) {
	r := startRelay(t, "  on_duplicate: flag\n", "")
	for range 3 {
		if res, hookErr := r.deliver("p1", "event_id", "e1"); res != nil || hookErr != nil {
			t.Fatal(res, hookErr)
		}
	}
	if n := r.seen(t, "end", "p1"); n != 1 {
		t.Fatalf("e1 published %d times, want 1", n)
	}
}

func TestAutoWithoutCommitPathFailsWithHowToFix(t *testing.T) {
	r := startRelay(t, "", "")
	err := r.sendPlain("p1", "event_id", "e1")
	if err == nil {
		t.Fatal("a message without delivery hooks was stored")
	}
	for _, want := range []string{"reliable_mqtt_in", "commit: immediate"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error does not say how to fix it (%q missing): %v", want, err)
		}
	}
	if r.lookup(t, "e1") {
		t.Fatal("key applied without a commit path")
	}
	if n := r.seen(t, "end", "p1"); n != 0 {
		t.Fatalf("message without commit path published %d times", n)
	}

	// The same message processed directly: flagged with the error.
	p := newTestProcessor(t, "path: "+filepath.Join(t.TempDir(), "l.db"))
	out, err := p.ProcessBatch(context.Background(), service.MessageBatch{streamtest.Message("p1", "event_id", "e1")})
	if err != nil || len(out) != 1 || !errors.Is(out[0][0].GetError(), dedup.ErrNoCommitPath) {
		t.Fatalf("got %v %v, want the message flagged with errNoCommitPath", out, err)
	}
	if p.l.InFlight() != 0 {
		t.Fatal("claim kept after the failure")
	}
}

func TestImmediateModeDropsCopiesAndLosesRetryOfFailedOutput(t *testing.T) {
	r := startRelay(t, "  commit: immediate\n", rejectIfFail)
	// No hooks needed.
	if err := r.sendPlain("p1", "event_id", "e1"); err != nil {
		t.Fatal(err)
	}
	if err := r.sendPlain("p1", "event_id", "e1"); err != nil {
		t.Fatal(err)
	}
	// The documented trade-off: the key is recorded before the output runs,
	// so when the output fails the retry is dropped and e2 never arrives.
	if err := r.sendPlain("p2", "event_id", "e2", "fail", "yes"); err == nil {
		t.Fatal("rejecting output succeeded")
	}
	if err := r.sendPlain("p2", "event_id", "e2"); err != nil {
		t.Fatal(err)
	}
	if n := r.seen(t, "end", "p1"); n != 1 {
		t.Fatalf("e1 published %d times, want 1", n)
	}
	if n := countOf(r.payloads(), "p2"); n != 0 {
		t.Fatalf("e2 published %d times; immediate mode should have lost it (if this changed, fix the docs)", n)
	}
}

func TestTwoCopiesInFlightNeverBothPassAndSecondIsNotLost(t *testing.T) {
	p := newTestProcessor(t, "path: "+filepath.Join(t.TempDir(), "l.db"))
	first := process(p, "x", "e1").wait(t)
	if !first.passed() {
		t.Fatal("first copy did not pass")
	}
	second := process(p, "x", "e1")
	time.Sleep(100 * time.Millisecond)
	if second.returned() {
		t.Fatal("second copy returned while the first was in flight")
	}
	// The first copy's output fails: the second passes.
	first.ack(t, errors.New("output failed"))
	if !second.wait(t).passed() {
		t.Fatal("second copy was lost after the first failed")
	}
	// A third copy waits for the second, which succeeds: duplicate.
	third := process(p, "x", "e1")
	time.Sleep(100 * time.Millisecond)
	if third.returned() {
		t.Fatal("third copy returned while the second was in flight")
	}
	second.ack(t, nil)
	if third.wait(t); len(third.out) != 0 {
		t.Fatalf("third copy passed: %v", third.out)
	}
	if applied, _, _, _ := p.l.Lookup(claims.Key{ID: "e1"}); !applied {
		t.Fatal("key not applied after the hook ran with success")
	}
}

func TestManyCopiesInFlightExactlyOnePasses(t *testing.T) {
	p := newTestProcessor(t, "path: "+filepath.Join(t.TempDir(), "l.db"))
	const copies = 16
	flights := make([]*inFlight, copies)
	for i := range flights {
		flights[i] = process(p, "x", "e1")
	}
	acked := make([]bool, copies)
	passed := 0
	deadline := time.Now().Add(10 * time.Second)
	for left := copies; left > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d copies still blocked", left)
		}
		for i, f := range flights {
			if acked[i] || !f.returned() {
				continue
			}
			if f.err != nil {
				t.Fatal(f.err)
			}
			if f.passed() {
				passed++
			}
			f.ack(t, nil)
			acked[i] = true
			left--
		}
		time.Sleep(5 * time.Millisecond)
	}
	if passed != 1 {
		t.Fatalf("%d copies passed, want 1", passed)
	}
}

func TestWaitTimeoutFailsTheCopyForRetry(t *testing.T) {
	p := newTestProcessor(t, "path: "+filepath.Join(t.TempDir(), "l.db")+"\nwait_timeout: 50ms")
	first := process(p, "x", "e1").wait(t)
	second := process(p, "x", "e1").wait(t)
	if err := second.msg(t).GetError(); !errors.Is(err, claims.ErrInFlight) {
		t.Fatalf("got %v, want the message flagged with ErrInFlight", err)
	}
	first.ack(t, nil)
}

func TestCopiesInOneBatchPassOnce(t *testing.T) {
	p := newTestProcessor(t, "path: "+filepath.Join(t.TempDir(), "l.db"))
	ctx, hooks := commit.WithHooks(context.Background())
	batch := service.MessageBatch{}
	for range 3 {
		batch = append(batch, streamtest.Message("x", "event_id", "e1").WithContext(ctx))
	}
	out, err := p.ProcessBatch(ctx, batch)
	if err != nil || len(out) != 1 || len(out[0]) != 1 {
		t.Fatalf("got %v %v, want one message", out, err)
	}
	if err := hooks.Run(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

func TestSameKeyDifferentPayloadIsFlaggedConflict(t *testing.T) {
	p := newTestProcessor(t, "path: "+filepath.Join(t.TempDir(), "l.db"))
	process(p, "a", "e1").wait(t).ack(t, nil)
	f := process(p, "b", "e1").wait(t)
	m := f.msg(t)
	if v, ok := m.MetaGetMut(metaConflict); !ok || v != true {
		t.Fatalf("conflict not flagged: %v", v)
	}
	if m.GetError() != nil {
		t.Fatal(m.GetError())
	}
	f.ack(t, nil)
	_, hash, _, _ := p.l.Lookup(claims.Key{ID: "e1"})
	if hash != sha256.Sum256([]byte("a")) {
		t.Fatal("the conflicting copy replaced the applied payload hash")
	}
	if f := process(p, "a", "e1").wait(t); len(f.out) != 0 {
		t.Fatal("a true duplicate was not dropped")
	}
}

func TestFlagModeMarksDuplicates(t *testing.T) {
	p := newTestProcessor(t, "path: "+filepath.Join(t.TempDir(), "l.db")+"\non_duplicate: flag")
	process(p, "a", "e1").wait(t).ack(t, nil)
	m := process(p, "a", "e1").wait(t).msg(t)
	if v, ok := m.MetaGetMut(metaDuplicate); !ok || v != true {
		t.Fatalf("duplicate not flagged: %v", v)
	}
}

func TestMissingOrEmptyKeyFailsTheMessage(t *testing.T) {
	p := newTestProcessor(t, "path: "+filepath.Join(t.TempDir(), "l.db"))
	ctx, _ := commit.WithHooks(context.Background())
	for name, msg := range map[string]*service.Message{
		"missing metadata": streamtest.Message("x"),
		"empty":            streamtest.Message("x", "event_id", ""),
	} {
		out, err := p.ProcessBatch(ctx, service.MessageBatch{msg.WithContext(ctx)})
		if err != nil || len(out) != 1 {
			t.Fatalf("%s: %v %v", name, out, err)
		}
		if e := out[0][0].GetError(); e == nil || !strings.Contains(e.Error(), "no event key") {
			t.Fatalf("%s: got error %v, want a missing-key error", name, e)
		}
	}
	if p.l.Stats().Keys != 0 || p.l.InFlight() != 0 {
		t.Fatal("a keyless message touched the ledger")
	}
}

func TestNamespaceSeparatesProducers(t *testing.T) {
	p := newTestProcessor(t, "path: "+filepath.Join(t.TempDir(), "l.db")+"\nnamespace: ${! meta(\"producer\") }")
	send := func(producer string) *inFlight {
		ctx, hooks := commit.WithHooks(context.Background())
		f := &inFlight{hooks: hooks, done: make(chan struct{})}
		f.out, f.err = p.ProcessBatch(ctx, service.MessageBatch{streamtest.Message("x", "event_id", "e1", "producer", producer).WithContext(ctx)})
		close(f.done)
		return f
	}
	a := send("sensor-a")
	a.ack(t, nil)
	b := send("sensor-b")
	if !a.passed() || !b.passed() {
		t.Fatal("one event ID from two producers must pass twice")
	}
	b.ack(t, nil)
	if f := send("sensor-a"); len(f.out) != 0 {
		t.Fatal("duplicate within a namespace passed")
	}
	if f := send("null"); f.msg(t).GetError() == nil {
		t.Fatal(`a namespace of "null" (missing metadata) was accepted`)
	}
}

func TestRetentionExpiresKeysSoTheyPassAgain(t *testing.T) {
	p := newTestProcessor(t, "path: "+filepath.Join(t.TempDir(), "l.db")+"\nretention: 200ms")
	process(p, "x", "e1").wait(t).ack(t, nil)
	if f := process(p, "x", "e1").wait(t); len(f.out) != 0 {
		t.Fatal("duplicate passed before expiry")
	}
	eventually(t, 5*time.Second, "the key to expire", func() bool {
		applied, _, _, _ := p.l.Lookup(claims.Key{ID: "e1"})
		return !applied
	})
	f := process(p, "x", "e1").wait(t)
	if !f.passed() {
		t.Fatal("expired key did not pass again")
	}
	f.ack(t, nil)
}

func TestLedgerAndOutboxNameTheSameFile(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	// A relative path for one and an absolute one for the other must still
	// meet, or the participant would never run.
	l, err := ledger.Open("shared.db", ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ob, err := outbox.Open(filepath.Join(dir, "shared.db"), outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	if l.Path() != ob.Path() {
		t.Fatalf("ledger path %q != outbox path %q", l.Path(), ob.Path())
	}
}

func TestSpecRejectsBadConfig(t *testing.T) {
	for _, yaml := range []string{
		"path: ''",
		"path: x.db\non_duplicate: ignore",
		"path: x.db\ncommit: later",
		"path: x.db\nwait_timeout: 0s",
	} {
		conf, err := processorSpec().ParseYAML(yaml, nil)
		if err == nil {
			_, err = parseSettings(conf)
		}
		if err == nil {
			t.Errorf("config %q accepted", yaml)
		}
	}
}
