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

func TestReleaseCloseClosesOnceOnLastUse(t *testing.T) {
	var r Registry[*handle]
	open := func() (*handle, error) { return &handle{"f"}, nil }
	ok := func(*handle) error { return nil }
	h, _ := r.Acquire("f", ok, open)
	if _, err := r.Acquire("f", ok, open); err != nil {
		t.Fatal(err)
	}
	var closed []*handle
	closeFn := func(v *handle) error { closed = append(closed, v); return nil }
	if err := r.ReleaseClose("f", h, closeFn); err != nil || len(closed) != 0 {
		t.Fatalf("first of two uses: err %v, %d closes; want none", err, len(closed))
	}
	failed := errors.New("close failed")
	if err := r.ReleaseClose("f", h, func(v *handle) error { closed = append(closed, v); return failed }); !errors.Is(err, failed) || len(closed) != 1 {
		t.Fatalf("last use: err %v, %d closes; want the close error and one close", err, len(closed))
	}
	if err := r.ReleaseClose("f", h, closeFn); err != nil || len(closed) != 1 {
		t.Fatalf("after the last use: err %v, %d closes; want no second close", err, len(closed))
	}
	a, _ := r.Acquire("a", ok, open)
	b, _ := r.Acquire("b", ok, open)
	closed = nil
	r.Clear(func(v *handle) { closed = append(closed, v) })
	if len(closed) != 2 || r.Release("a", a) || r.Release("b", b) {
		t.Fatalf("Clear closed %d handles and left entries behind; want 2 and none", len(closed))
	}
}
