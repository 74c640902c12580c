package registry

import (
	"errors"
	"testing"
)

type handle struct{ name string }

func TestAcquireSharesAndLastReleaseRemoves(t *testing.T) {
	var r Registry[*handle]
	opens := 0
	open := func() (*handle, error) { opens++; return &handle{"a"}, nil }
	ok := func(*handle) error { return nil }
	h1, err := r.Acquire("a", ok, open)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := r.Acquire("a", ok, open)
	if err != nil || h2 != h1 || opens != 1 {
		t.Fatalf("second Acquire: %v, same handle %v, %d opens; want the shared handle and 1 open", err, h2 == h1, opens)
	}
	refused := errors.New("other settings")
	if _, err := r.Acquire("a", func(*handle) error { return refused }, open); !errors.Is(err, refused) {
		t.Fatalf("refused join: got %v", err)
	}
	if r.Release("a", h1) {
		t.Fatal("first of two Releases reported last")
	}
	if !r.Release("a", h2) {
		t.Fatal("second of two Releases did not report last")
	}
	if r.Release("a", h1) {
		t.Fatal("a Release after the last reported last again")
	}
	h3, err := r.Acquire("a", ok, open)
	if err != nil || h3 == h1 || opens != 2 {
		t.Fatalf("Acquire after the last Release: %v, reused the closed handle %v, %d opens; want a new one", err, h3 == h1, opens)
	}
	// The old handle's stray Release must not count against the new one.
	if r.Release("a", h1) || !r.Release("a", h3) {
		t.Fatal("a stale handle's Release was counted against the new handle")
	}
	failed := errors.New("cannot open")
	if _, err := r.Acquire("b", ok, func() (*handle, error) { return nil, failed }); !errors.Is(err, failed) {
		t.Fatalf("failing open: got %v", err)
	}
	if _, err := r.Acquire("b", func(*handle) error { t.Fatal("joined a handle that failed to open"); return nil }, open); err != nil {
		t.Fatal(err)
	}
}
