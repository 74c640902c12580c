package ledger

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// childCommitEnv makes the test binary a process that commits keys, prints
// how many are durable, and waits to be killed.
const childCommitEnv = "LEDGER_TEST_COMMIT"

func TestMain(m *testing.M) {
	if path := os.Getenv(childCommitEnv); path != "" {
		os.Exit(commitUntilKilled(path))
	}
	os.Exit(m.Run())
}

func commitUntilKilled(path string) int {
	l, err := Open(path, Options{})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	for i := 0; ; i++ {
		c, v, err := l.Claim(context.Background(), claims.Key{Namespace: "crash", ID: strconv.Itoa(i)}, hashOf("p"), time.Second)
		if err != nil || v != claims.Pass {
			fmt.Println("error:", v, err)
			return 1
		}
		if err := c.Commit(context.Background()); err != nil {
			fmt.Println("error:", err)
			return 1
		}
		fmt.Println("committed", i) // printed only after the fsync
	}
}

func hashOf(s string) [32]byte { return sha256.Sum256([]byte(s)) }

func openT(t testing.TB, path string, opts Options) *Ledger {
	t.Helper()
	l, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !l.isClosed() {
			_ = l.Close()
		}
	})
	return l
}

func claimT(t testing.TB, l *Ledger, key claims.Key, payload string) (*Claim, claims.Verdict) {
	t.Helper()
	c, v, err := l.Claim(context.Background(), key, hashOf(payload), time.Second)
	if err != nil {
		t.Fatalf("claim %s: %v", key, err)
	}
	return c, v
}

func TestCommittedKeyIsDuplicateAfterReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := openT(t, path, Options{})
	key := claims.Key{Namespace: "sensor-demo", ID: "batch-42"}
	c, v := claimT(t, l, key, `{"delta":1}`)
	if v != claims.Pass {
		t.Fatalf("first copy: got %v, want pass", v)
	}
	if err := c.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, v := claimT(t, l, key, `{"delta":1}`); v != claims.Duplicate {
		t.Fatalf("second copy: got %v, want duplicate", v)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l = openT(t, path, Options{})
	if _, v := claimT(t, l, key, `{"delta":1}`); v != claims.Duplicate {
		t.Fatalf("after reopen: got %v, want duplicate", v)
	}
	// The namespace is part of the key.
	if c, v := claimT(t, l, claims.Key{Namespace: "other-producer", ID: "batch-42"}, `{"delta":1}`); v != claims.Pass {
		t.Fatalf("other namespace: got %v, want pass", v)
	} else {
		c.Release()
	}
	if got := l.Stats().Keys; got != 1 {
		t.Fatalf("key count after reopen = %d, want 1", got)
	}
}

func TestSameKeyDifferentPayloadIsConflict(t *testing.T) {
	l := openT(t, filepath.Join(t.TempDir(), "ledger.db"), Options{})
	key := claims.Key{Namespace: "p", ID: "e1"}
	c, _ := claimT(t, l, key, "a")
	if err := c.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, v := claimT(t, l, key, "b"); v != claims.Conflict {
		t.Fatalf("got %v, want conflict", v)
	}
}

func TestNamespaceAndKeyDoNotCollide(t *testing.T) {
	l := openT(t, filepath.Join(t.TempDir(), "ledger.db"), Options{})
	c, _ := claimT(t, l, claims.Key{Namespace: "a", ID: "bc"}, "x")
	if err := c.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c, v := claimT(t, l, claims.Key{Namespace: "ab", ID: "c"}, "x"); v != claims.Pass {
		t.Fatalf("(ab,c) after (a,bc): got %v, want pass", v)
	} else {
		c.Release()
	}
}

func TestEmptyAndOversizedKeysAreRefused(t *testing.T) {
	l := openT(t, filepath.Join(t.TempDir(), "ledger.db"), Options{})
	if _, _, err := l.Claim(context.Background(), claims.Key{Namespace: "ns", ID: ""}, hashOf("x"), time.Second); err == nil {
		t.Fatal("empty key was accepted")
	}
	if _, _, err := l.Claim(context.Background(), claims.Key{Namespace: "", ID: strings.Repeat("k", MaxKeyBytes+1)}, hashOf("x"), time.Second); err == nil {
		t.Fatal("oversized key was accepted")
	}
}

func TestSecondCopyWaitsForFirst(t *testing.T) {
	l := openT(t, filepath.Join(t.TempDir(), "ledger.db"), Options{})
	key := claims.Key{Namespace: "p", ID: "e1"}

	type result struct {
		c   *Claim
		v   claims.Verdict
		err error
	}
	second := func() chan result {
		ch := make(chan result, 1)
		go func() {
			c, v, err := l.Claim(context.Background(), key, hashOf("x"), 5*time.Second)
			ch <- result{c, v, err}
		}()
		return ch
	}
	notYet := func(ch chan result) {
		t.Helper()
		select {
		case r := <-ch:
			t.Fatalf("second copy returned while the first was in flight: %v %v", r.v, r.err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	get := func(ch chan result) result {
		t.Helper()
		select {
		case r := <-ch:
			return r
		case <-time.After(5 * time.Second):
			t.Fatal("second copy never returned")
			return result{}
		}
	}

	// First fails: the second is not lost, it passes.
	first, _ := claimT(t, l, key, "x")
	ch := second()
	notYet(ch)
	first.Release()
	r := get(ch)
	if r.err != nil || r.v != claims.Pass {
		t.Fatalf("after the first released: %v %v, want pass", r.v, r.err)
	}

	// That copy commits: a third copy waiting on it becomes a duplicate.
	ch = second()
	notYet(ch)
	if err := r.c.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := get(ch); r.err != nil || r.v != claims.Duplicate {
		t.Fatalf("after the first committed: %v %v, want duplicate", r.v, r.err)
	}
}

func TestWaitForCopyInFlightTimesOut(t *testing.T) {
	l := openT(t, filepath.Join(t.TempDir(), "ledger.db"), Options{})
	key := claims.Key{Namespace: "p", ID: "e1"}
	first, _ := claimT(t, l, key, "x")
	_, _, err := l.Claim(context.Background(), key, hashOf("x"), 50*time.Millisecond)
	if !errors.Is(err, claims.ErrInFlight) {
		t.Fatalf("got %v, want ErrInFlight", err)
	}
	first.Release()
}

func TestManyConcurrentCopiesExactlyOnePasses(t *testing.T) {
	l := openT(t, filepath.Join(t.TempDir(), "ledger.db"), Options{})
	const copies = 32
	var mu sync.Mutex
	verdicts := map[claims.Verdict]int{}
	var wg sync.WaitGroup
	for range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, v, err := l.Claim(context.Background(), claims.Key{Namespace: "p", ID: "same"}, hashOf("x"), 10*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			if v == claims.Pass {
				if err := c.Commit(context.Background()); err != nil {
					t.Error(err)
				}
			}
			mu.Lock()
			verdicts[v]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if verdicts[claims.Pass] != 1 || verdicts[claims.Duplicate] != copies-1 {
		t.Fatalf("verdicts %v, want 1 pass and %d duplicates", verdicts, copies-1)
	}
}

func TestApplyCommitsOnlyWithItsTransaction(t *testing.T) {
	l := openT(t, filepath.Join(t.TempDir(), "ledger.db"), Options{})
	key := claims.Key{Namespace: "p", ID: "e1"}
	c, _ := claimT(t, l, key, "x")

	// A rolled-back transaction leaves the key unapplied and the claim held.
	errRollback := errors.New("roll back")
	err := l.db.Update(func(tx *bolt.Tx) error {
		if err := c.Apply(tx); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	if applied, _, _, _ := l.Lookup(key); applied || c.Committed() {
		t.Fatal("key applied by a rolled-back transaction")
	}

	if err := l.db.Update(c.Apply); err != nil {
		t.Fatal(err)
	}
	if applied, _, _, _ := l.Lookup(key); !applied || !c.Committed() {
		t.Fatalf("after commit: applied=%v committed=%v", applied, c.Committed())
	}
	// Commit after Apply is a no-op; Release cannot undo it.
	if err := c.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c.Release() {
		t.Fatal("released a committed claim")
	}
	if got := l.Stats().Keys; got != 1 {
		t.Fatalf("keys = %d, want 1", got)
	}
}

// The ledger and the outbox share one file and one transaction: the key is
// applied exactly when the record is appended.
func TestApplyAsOutboxParticipant(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shared.db")
	l := openT(t, path, Options{})
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	if ob.Path() != l.Path() {
		t.Fatalf("outbox path %q != ledger path %q: participants would never match", ob.Path(), l.Path())
	}
	skip := func(run func(*bolt.Tx) error) func(*bolt.Tx) error {
		return func(tx *bolt.Tx) error {
			if err := run(tx); errors.Is(err, commit.ErrAlreadyApplied) {
				return commit.ErrAlreadyApplied
			} else {
				return err
			}
		}
	}
	key := claims.Key{Namespace: "p", ID: "e1"}
	c, _ := claimT(t, l, key, "payload")
	if _, err := ob.Append(context.Background(), outbox.Entry{Event: mqttmsg.Event{EventID: "e1", Topic: "t", Payload: []byte("payload")}, Participants: []func(*bolt.Tx) error{skip(c.Apply)}}); err != nil {
		t.Fatal(err)
	}
	if !c.Committed() || ob.Stats().Pending != 1 {
		t.Fatalf("committed=%v pending=%d, want true and 1", c.Committed(), ob.Stats().Pending)
	}
	// A copy marked duplicate appends nothing even after the record was sent
	// and removed.
	recs, err := ob.Read(0, 10)
	if err != nil || len(recs) != 1 {
		t.Fatal(recs, err)
	}
	if err := ob.Remove(recs[0].Seq); err != nil {
		t.Fatal(err)
	}
	if _, v := claimT(t, l, key, "payload"); v != claims.Duplicate {
		t.Fatalf("got %v, want duplicate", v)
	}
	rec, err := ob.Append(context.Background(), outbox.Entry{Event: mqttmsg.Event{EventID: "e1", Topic: "t", Payload: []byte("payload")}, Participants: []func(*bolt.Tx) error{skip(l.SkipIfApplied(key, hashOf("payload")))}})
	if err != nil || rec.Seq != 0 || ob.Stats().Pending != 0 {
		t.Fatalf("duplicate append: seq=%d err=%v pending=%d, want skipped", rec.Seq, err, ob.Stats().Pending)
	}
}

func TestRetentionExpiresOldKeysAndBoundsSize(t *testing.T) {
	l := openT(t, filepath.Join(t.TempDir(), "ledger.db"), Options{Retention: 200 * time.Millisecond, ExpireBatch: 50, ExpireInterval: 20 * time.Millisecond})
	// A steady stream: 20 rounds of 50 keys, 50 ms apart (~1,000 keys/s).
	// With 200 ms retention the ledger should hold about 4-5 rounds.
	maxSeen := int64(0)
	for round := range 20 {
		for i := range 50 {
			c, v := claimT(t, l, claims.Key{Namespace: "p", ID: fmt.Sprintf("%d-%d", round, i)}, "x")
			if v != claims.Pass {
				t.Fatalf("fresh key: %v", v)
			}
			if err := c.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		maxSeen = max(maxSeen, l.Stats().Keys)
		time.Sleep(50 * time.Millisecond)
	}
	// Bounded: far below the 1,000 keys written. The bound is generous
	// (a slow machine may delay the expirer) but a ledger that never
	// expires would reach 1,000.
	if maxSeen >= 600 {
		t.Fatalf("ledger grew to %d keys with 200ms retention; expiry is not keeping up", maxSeen)
	}
	if l.Stats().Expired == 0 {
		t.Fatal("nothing expired")
	}
	// An expired key passes again.
	if c, v := claimT(t, l, claims.Key{Namespace: "p", ID: "0-0"}, "x"); v != claims.Pass {
		t.Fatalf("expired key: got %v, want pass", v)
	} else {
		c.Release()
	}
	// The stored count matches the keys, read in one transaction: the
	// expirer runs on, and the in-memory count follows its commits.
	var n int
	var count uint64
	_ = l.db.View(func(tx *bolt.Tx) error {
		n, count = tx.Bucket(bucketKeys).Stats().KeyN, boltfile.Uint64(tx.Bucket(bucketMeta), keyCount)
		return nil
	})
	if uint64(n) != count {
		t.Fatalf("count %d != keys in bucket %d", count, n)
	}
}

func TestExpireKeepsClaimedKeysAndIsBatched(t *testing.T) {
	l := openT(t, filepath.Join(t.TempDir(), "ledger.db"), Options{ExpireBatch: 10})
	for i := range 25 {
		c, _ := claimT(t, l, claims.Key{Namespace: "p", ID: strconv.Itoa(i)}, "x")
		if err := c.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	n, more, err := l.expireBatch(time.Now().Add(time.Hour))
	if err != nil || n != 10 || !more {
		t.Fatalf("one batch: deleted %d more=%v err=%v, want 10 and more", n, more, err)
	}
	n, err = l.Expire(time.Now().Add(time.Hour))
	if err != nil || n != 15 || l.Stats().Keys != 0 {
		t.Fatalf("rest: deleted %d err=%v keys=%d", n, err, l.Stats().Keys)
	}
}

// A SIGKILLed process loses no key it reported as committed.
func TestCommittedKeysSurviveSIGKILL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	cmd := harness.TestChild(childCommitEnv + "=" + path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	last := -1
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "error") {
			t.Fatal(line)
		}
		if n, err := strconv.Atoi(strings.TrimPrefix(line, "committed ")); err == nil {
			last = n
		}
		if last >= 200 {
			break
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if last < 200 {
		t.Fatalf("child committed only %d keys", last)
	}

	l := openT(t, path, Options{})
	for i := 0; i <= last; i++ {
		if applied, _, _, err := l.Lookup(claims.Key{Namespace: "crash", ID: strconv.Itoa(i)}); err != nil || !applied {
			t.Fatalf("key %d reported committed before SIGKILL is missing (err %v)", i, err)
		}
	}
	if got := l.Stats().Keys; got < int64(last+1) {
		t.Fatalf("stored count %d < %d committed keys", got, last+1)
	}
}

func TestOpenSharesOneLedgerPerFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	a := openT(t, path, Options{})
	b, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("two ledgers for one file: their claims would not see each other")
	}
	if _, err := Open(path, Options{Retention: time.Hour}); err == nil {
		t.Fatal("a different retention on the same file was accepted")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// a still works after b's Close.
	c, _ := claimT(t, a, claims.Key{Namespace: "p", ID: "x"}, "x")
	if err := c.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A message split after dedup_ledger carries one claim on every part: every
// part is stored and the key is applied once, whether the parts land in one
// outbox transaction or in several.
func TestSplitMessageStoresEveryPartUnderOneClaim(t *testing.T) {
	for _, together := range []bool{false, true} {
		name := map[bool]string{false: "separate transactions", true: "one transaction"}[together]
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "shared.db")
			l := openT(t, path, Options{})
			ob, err := outbox.Open(path, outbox.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer ob.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			key := claims.Key{Namespace: "p", ID: "split-1"}
			c, _ := claimT(t, l, key, "whole message")
			appendPart := func(id string) error {
				_, err := ob.Append(ctx, outbox.Entry{Event: mqttmsg.Event{EventID: id, Topic: "t", Payload: []byte(id)}, Participants: []func(*bolt.Tx) error{c.Apply}})
				return err
			}

			var wg sync.WaitGroup
			errs := make([]error, 3)
			if together {
				// Hold the committer so that all parts queue into one group.
				block := make(chan struct{})
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := ob.Append(ctx, outbox.Entry{Event: mqttmsg.Event{EventID: "blocker", Topic: "t", Payload: []byte("b")}, Participants: []func(*bolt.Tx) error{func(*bolt.Tx) error { <-block; return nil }}})
					errs[0] = err
				}()
				time.Sleep(50 * time.Millisecond)
				for i, id := range []string{"part-1", "part-2"} {
					wg.Add(1)
					go func() { defer wg.Done(); errs[i+1] = appendPart(id) }()
				}
				time.Sleep(50 * time.Millisecond)
				close(block)
				wg.Wait()
			} else {
				errs[1], errs[2] = appendPart("part-1"), appendPart("part-2")
			}
			for i, err := range errs {
				if err != nil {
					t.Fatalf("append %d: %v", i, err)
				}
			}
			want := 2
			if together {
				want = 3 // the blocker too
			}
			if got := ob.Stats().Pending; got != want {
				t.Fatalf("outbox holds %d records, want %d: a part was dropped", got, want)
			}
			if !c.Committed() {
				t.Fatal("the claim is not committed after its parts were stored")
			}
			if applied, _, _, err := l.Lookup(key); err != nil || !applied {
				t.Fatalf("key not applied after its parts were stored (err %v)", err)
			}
		})
	}
}
