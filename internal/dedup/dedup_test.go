package dedup

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
)

type counter struct{ n atomic.Int64 }

func (c *counter) Incr(n int64, _ ...string) { c.n.Add(n) }

// stores opens each kind of store on a fresh file: the bbolt ledger and an
// SQLite table, both real.
var stores = map[string]func(t *testing.T) Store{
	"bbolt": func(t *testing.T) Store {
		l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return Bolt(l)
	},
	"sqlite": func(t *testing.T) Store {
		p, err := sqlledger.OpenPool(context.Background(), sqlledger.PoolConfig{
			Config:   sqlledger.Config{Driver: sqlledger.SQLite, DSN: filepath.Join(t.TempDir(), "ledger.sqlite"), Table: "ledger"},
			MaxBatch: 8,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Release() })
		return SQL(p)
	},
}

type gateT struct {
	*Gate
	passed, commits, releases counter
}

func newGate(s Store, immediate bool) *gateT {
	g := &gateT{}
	g.Gate = &Gate{Store: s, Wait: time.Second, Immediate: immediate, Passed: &g.passed, Commits: &g.commits, Releases: &g.releases}
	return g
}

// check runs one copy through a batch of its own, with delivery hooks.
func (g *gateT) check(t *testing.T, id, payload string) (Decision, *commit.Hooks) {
	t.Helper()
	_, hooks := commit.WithHooks(context.Background())
	return g.Batch().Check(context.Background(), claims.Key{Namespace: "p", ID: id}, Hash([]byte(payload)), hooks), hooks
}

// A passed copy's key is recorded only when the pipeline delivers it: a
// copy after a failed delivery passes again, a copy after a delivered one
// is a duplicate (or a conflict, with another payload).
func TestKeyIsRecordedOnlyWhenTheCopyIsDelivered(t *testing.T) {
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			g := newGate(open(t), false)
			ctx := context.Background()
			d, hooks := g.check(t, "e1", "a")
			if d.Err != nil || d.Verdict != claims.Pass {
				t.Fatalf("first copy: %+v, want pass", d)
			}
			if err := hooks.Run(ctx, errors.New("output down")); err != nil {
				t.Fatalf("hooks of a failed delivery: %v", err)
			}
			if d, hooks = g.check(t, "e1", "a"); d.Verdict != claims.Pass {
				t.Fatalf("copy after a failed delivery: %+v, want pass", d)
			}
			if err := hooks.Run(ctx, nil); err != nil {
				t.Fatalf("hooks of a delivered copy: %v", err)
			}
			if d, _ = g.check(t, "e1", "a"); d.Err != nil || d.Verdict != claims.Duplicate {
				t.Fatalf("copy after delivery: %+v, want duplicate", d)
			}
			if d, _ = g.check(t, "e1", "b"); d.Err != nil || d.Verdict != claims.Conflict {
				t.Fatalf("other payload after delivery: %+v, want conflict", d)
			}
			if p, c, r := g.passed.n.Load(), g.commits.n.Load(), g.releases.n.Load(); p != 2 || c != 1 || r != 1 {
				t.Fatalf("passed %d, commits %d, releases %d; want 2, 1, 1", p, c, r)
			}
			// Only the bbolt ledger joins a writer's transaction.
			if d, _ = g.check(t, "e2", "a"); (d.Join != nil) != (name == "bbolt") {
				t.Fatalf("%s: participant %v on a passed copy", name, d.Join)
			}
		})
	}
}

// Copies of one key in one batch share the first copy's fate without
// waiting for its claim (that would wait for ourselves).
func TestCopiesInOneBatchShareTheFirstsFate(t *testing.T) {
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			g := newGate(open(t), false)
			ctx, hooks := commit.WithHooks(context.Background())
			b := g.Batch()
			k := claims.Key{ID: "e1"}
			var got []string
			for _, payload := range []string{"a", "a", "b"} {
				d := b.Check(ctx, k, Hash([]byte(payload)), hooks)
				if d.Err != nil {
					t.Fatalf("copy %q: %v", payload, d.Err)
				}
				got = append(got, d.Verdict.String())
			}
			if strings.Join(got, " ") != "pass duplicate conflict" {
				t.Fatalf("verdicts %v, want pass duplicate conflict", got)
			}
		})
	}
}

// Without delivery hooks commit: auto cannot know when the effect commits:
// the copy fails with how to fix it, and its claim is given back.
// Immediate records the key at once.
func TestWithoutHooksAutoFailsAndImmediateRecords(t *testing.T) {
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			g := newGate(s, false)
			d := g.Batch().Check(context.Background(), claims.Key{ID: "e1"}, Hash([]byte("a")), nil)
			if !errors.Is(d.Err, s.NoHooks()) || !strings.Contains(d.Err.Error(), "commit: immediate") {
				t.Fatalf("copy without hooks: %+v, want %v", d, s.NoHooks())
			}
			if g.releases.n.Load() != 1 {
				t.Fatalf("releases %d, want 1", g.releases.n.Load())
			}
			now := newGate(s, true)
			if d = now.Batch().Check(context.Background(), claims.Key{ID: "e1"}, Hash([]byte("a")), nil); d.Err != nil || d.Verdict != claims.Pass {
				t.Fatalf("immediate copy: %+v, want pass", d)
			}
			// Another namespace is another key.
			if d, _ = now.check(t, "e1", "a"); d.Verdict != claims.Pass {
				t.Fatalf("p/e1 after e1: %+v, want pass", d)
			}
			if d = now.Batch().Check(context.Background(), claims.Key{ID: "e1"}, Hash([]byte("a")), nil); d.Verdict != claims.Duplicate {
				t.Fatalf("copy after an immediate record: %+v, want duplicate", d)
			}
			if now.commits.n.Load() != 2 {
				t.Fatalf("commits %d, want 2", now.commits.n.Load())
			}
		})
	}
}

func TestNewKeyRefusesMissingKeys(t *testing.T) {
	for _, tc := range []struct{ ns, id, want string }{
		{"", "", "no event key"},
		{"p", "null", "no event key"},
		{"null", "e1", "namespace"},
	} {
		if _, err := NewKey(tc.ns, tc.id); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewKey(%q, %q) = %v, want an error about %s", tc.ns, tc.id, err, tc.want)
		}
	}
	if k, err := NewKey("p", "e1"); err != nil || k != (claims.Key{Namespace: "p", ID: "e1"}) {
		t.Fatalf("NewKey(p, e1) = %v, %v", k, err)
	}
}
