package commit

import (
	"context"
	"errors"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func TestHooksRunOnceInOrderAndAllOfThem(t *testing.T) {
	if HooksFrom(context.Background()) != nil {
		t.Fatal("HooksFrom found hooks in a context without them")
	}
	ctx, h := WithHooks(context.Background())
	if HooksFrom(ctx) != h {
		t.Fatal("HooksFrom did not return the list WithHooks attached")
	}
	var order []string
	var seen []error
	hook := func(name string, fail error) DeliveryHook {
		return func(_ context.Context, result error) error {
			order = append(order, name)
			seen = append(seen, result)
			return fail
		}
	}
	errA, errC := errors.New("a failed"), errors.New("c failed")
	for _, r := range []DeliveryHook{hook("a", errA), hook("b", nil), hook("c", errC)} {
		if err := h.Register(r); err != nil {
			t.Fatal(err)
		}
	}
	nack := errors.New("output failed")
	err := h.Run(context.Background(), nack)
	if !errors.Is(err, errA) || !errors.Is(err, errC) {
		t.Fatalf("Run returned %v, want both hook errors joined", err)
	}
	if strings.Join(order, ",") != "a,b,c" {
		t.Fatalf("hooks ran in order %v, want a,b,c (every one, even after a failure)", order)
	}
	for i, r := range seen {
		if r != nack {
			t.Fatalf("hook %d saw result %v, want the pipeline's %v", i, r, nack)
		}
	}
	if err := h.Run(context.Background(), nil); err != nil || len(order) != 3 {
		t.Fatalf("second Run: err %v, %d hook calls; want nil and no new calls", err, len(order)-3)
	}
	if err := h.Register(hook("late", nil)); !errors.Is(err, ErrHooksRan) {
		t.Fatalf("Register after Run: got %v, want ErrHooksRan", err)
	}
}

func TestParticipantsAreBoundToTheirFile(t *testing.T) {
	mark := func(name string, calls *[]string) func(*bolt.Tx) error {
		return func(*bolt.Tx) error { *calls = append(*calls, name); return nil }
	}
	var calls []string
	base := WithParticipant(context.Background(), Participant{Path: "/a", Run: mark("a1", &calls)})
	// Two messages derived from one context must not share a slice: adding
	// to one must not show up in the other.
	one := WithParticipant(base, Participant{Path: "/a", Run: mark("a2", &calls)})
	two := WithParticipant(base, Participant{Path: "/b", Run: mark("b1", &calls)})
	run := func(ctx context.Context, path string) string {
		calls = nil
		for _, p := range ParticipantsFor(ctx, path) {
			if err := p(nil); err != nil {
				t.Fatal(err)
			}
		}
		return strings.Join(calls, ",")
	}
	for _, tc := range []struct {
		ctx        context.Context
		path, want string
	}{
		{one, "/a", "a1,a2"},
		{two, "/a", "a1"},
		{two, "/b", "b1"},
		{base, "/b", ""},
		{context.Background(), "/a", ""},
	} {
		if got := run(tc.ctx, tc.path); got != tc.want {
			t.Errorf("participants for %s: ran %q, want %q", tc.path, got, tc.want)
		}
	}
}
