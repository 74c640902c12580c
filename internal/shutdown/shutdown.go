// Package shutdown is the one close convention of the tree. Benthos hands
// Close a context without deadline, so every component bounds its own
// Close: it waits for work in progress at most its budget below (or until
// the caller's ctx ends, if sooner), then says what it left behind instead
// of hanging. Budgets nest: a Close that waits for another bounded Close
// allows Outer of the inner one, so the inner error, which names what is
// stuck, is the one the user sees.
package shutdown

import (
	"context"
	"fmt"
	"time"
)

const (
	// Commit bounds the wait for durable work in progress: a commit of the
	// outbox, the bbolt ledger or the embedded broker's store, and an
	// input's acknowledgements (docs/guarantees.md: "10 s for a commit in
	// progress").
	Commit = 10 * time.Second
	// Send bounds the output's wait for its sender to stop
	// (docs/guarantees.md: "5 s for the sender").
	Send = 5 * time.Second
	// Margin is what an outer bound adds to the inner one it waits for.
	Margin = 5 * time.Second
)

// Outer is the bound of a Close that waits for an inner Close bounded by
// inner.
func Outer(inner time.Duration) time.Duration { return inner + Margin }

// Wait waits until every channel in done is closed, for at most limit in
// all, and reports whether they all were.
func Wait(limit time.Duration, done ...<-chan struct{}) bool {
	return Until(context.Background(), limit, done...)
}

// Until is Wait that also gives up when ctx ends: the one way a Close
// waits for work in progress.
func Until(ctx context.Context, limit time.Duration, done ...<-chan struct{}) bool {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for _, d := range done {
		select {
		case <-d:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// Go runs fn in its own goroutine; the channel is closed when it returns.
func Go(fn func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	return done
}

// Within runs release and returns its error, or gives up when ctx ends or
// limit passes (release keeps running; what names it in the error).
func Within(ctx context.Context, limit time.Duration, what string, release func() error) error {
	var err error
	if Until(ctx, limit, Go(func() { err = release() })) {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("closing %s: timed out after %s", what, limit)
}

// Closed reports, without blocking, whether ch (a component's closing or
// done channel) has been closed.
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
