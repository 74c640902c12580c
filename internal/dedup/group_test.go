package dedup

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
)

// The keys of a frame's events, checked as one batch and settled with a
// commit.Group (as reliable_mqtt_in settles a frame), are recorded in ONE
// transaction of the bbolt ledger; an event that failed has its key
// released, so the redelivered frame passes it and drops the others.
func TestAFramesKeysAreRecordedInOneTransaction(t *testing.T) {
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	g := newGate(Bolt(l), false)
	const n = 64
	check := func() ([]claims.Verdict, []*commit.Hooks) {
		b := g.Batch()
		var vs []claims.Verdict
		var hs []*commit.Hooks
		for i := 0; i < n; i++ {
			_, hooks := commit.WithHooks(context.Background())
			d := b.Check(context.Background(), claims.Key{ID: fmt.Sprintf("ev-%d", i)}, Hash([]byte("p")), hooks)
			if d.Err != nil {
				t.Fatal(d.Err)
			}
			vs, hs = append(vs, d.Verdict), append(hs, hooks)
		}
		return vs, hs
	}
	_, hs := check()
	before := l.Stats().Transactions
	ctx, group := commit.WithGroup(context.Background())
	for i, h := range hs {
		var result error
		if i == 7 {
			result = errors.New("event 8 failed")
		}
		if err := h.Run(ctx, result); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.Stats().Commits; got != 0 {
		t.Fatalf("%d keys recorded before the group's flush", got)
	}
	if err := group.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tx, keys := l.Stats().Transactions-before, l.Stats().Keys; tx != 1 || keys != n-1 {
		t.Fatalf("%d transactions recorded %d keys; want 1 transaction for the %d events that succeeded", tx, keys, n-1)
	}
	vs, _ := check() // the frame comes again
	for i, v := range vs {
		if want := map[bool]claims.Verdict{true: claims.Pass, false: claims.Duplicate}[i == 7]; v != want {
			t.Fatalf("redelivered event %d: %v, want %v", i+1, v, want)
		}
	}
}
