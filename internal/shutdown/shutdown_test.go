package shutdown

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestWaitReportsWhetherAllFinished(t *testing.T) {
	a, b := make(chan struct{}), make(chan struct{})
	close(a)
	if Wait(10*time.Millisecond, a, b) {
		t.Fatal("Wait reported success while one channel was still open")
	}
	close(b)
	if !Wait(time.Minute, a, b) {
		t.Fatal("Wait reported a timeout although both channels were closed")
	}
}

func TestWithinReturnsTheErrorOrGivesUp(t *testing.T) {
	boom := errors.New("boom")
	if err := Within(context.Background(), time.Minute, "x", func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Within returned %v, want release's error", err)
	}
	stuck := make(chan struct{})
	defer close(stuck)
	hang := func() error { <-stuck; return nil }
	if err := Within(context.Background(), 10*time.Millisecond, "the widget", hang); err == nil || !strings.Contains(err.Error(), "closing the widget: timed out after 10ms") {
		t.Fatalf("Within on a stuck release returned %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Within(ctx, time.Minute, "x", hang); !errors.Is(err, context.Canceled) {
		t.Fatalf("Within with an ended ctx returned %v", err)
	}
	if Outer(Commit) <= Commit {
		t.Fatal("an outer bound must exceed the inner one")
	}
}

func TestUntilGivesUpWhenTheContextEnds(t *testing.T) {
	open := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Until(ctx, time.Minute, open) {
		t.Fatal("Until reported success for an open channel")
	}
	close(open)
	if !Until(context.Background(), time.Minute, open) {
		t.Fatal("Until reported a timeout for a closed channel")
	}
}
