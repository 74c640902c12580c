package claims

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestTakeHoldsOneCopyAtATime(t *testing.T) {
	tb := New(nil)
	h, err := tb.Take(context.Background(), "k", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !tb.Held("k") || tb.Len() != 1 {
		t.Fatalf("held %v, len %d after Take; want true, 1", tb.Held("k"), tb.Len())
	}
	// A second copy waits; it gets the key once the first one settles.
	got := make(chan error, 1)
	go func() {
		h2, err := tb.Take(context.Background(), "k", 10*time.Second)
		if err == nil && h2.State() != Held {
			err = errors.New("new claim not in state Held")
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second Take returned (%v) while the first claim was held", err)
	case <-time.After(50 * time.Millisecond):
	}
	if !h.Settle(Committed) {
		t.Fatal("first Settle returned false")
	}
	if h.Settle(Released) || h.State() != Committed {
		t.Fatalf("second Settle changed the claim: state %v", h.State())
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("second Take still waiting 5s after the first claim settled")
	}
	// Other keys are independent.
	if _, err := tb.Take(context.Background(), "other", 0); err != nil {
		t.Fatal(err)
	}
}

func TestTakeGivesUp(t *testing.T) {
	closing := make(chan struct{})
	tb := New(closing)
	if _, err := tb.Take(context.Background(), "k", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Take(context.Background(), "k", 20*time.Millisecond); !errors.Is(err, ErrInFlight) {
		t.Fatalf("after the wait: got %v, want ErrInFlight", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tb.Take(ctx, "k", time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: got %v, want context.Canceled", err)
	}
	done := make(chan error, 1)
	go func() { _, err := tb.Take(context.Background(), "k", time.Minute); done <- err }()
	close(closing)
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("waiting copy at close: got %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting Take did not return within 5s of closing")
	}
	if _, err := tb.Take(context.Background(), "new", time.Second); !errors.Is(err, ErrClosed) {
		t.Fatalf("Take after closing: got %v, want ErrClosed", err)
	}
	for _, h := range tb.Holds() {
		h.Settle(Released)
	}
	if tb.Len() != 0 {
		t.Fatalf("%d claims left after settling every hold", tb.Len())
	}
}

// A key reads the same in both ledgers' errors: quoted, namespace first.
func TestKeyString(t *testing.T) {
	for _, tc := range []struct {
		k    Key
		want string
	}{
		{Key{ID: "e1"}, `"e1"`},
		{Key{Namespace: "sensor-demo", ID: "e1"}, `"sensor-demo/e1"`},
		{Key{Namespace: "p", ID: "a\nb"}, `"p/a\nb"`},
	} {
		if got := tc.k.String(); got != tc.want {
			t.Errorf("%#v.String() = %s, want %s", tc.k, got, tc.want)
		}
	}
}
