package backoff

import (
	"strings"
	"testing"
	"time"
)

func TestAfterDoublesFromInitialUpToMax(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000}
	for i, w := range want {
		if got := b.After(i + 1); got != w*time.Millisecond {
			t.Errorf("After(%d) = %s, want %s", i+1, got, w*time.Millisecond)
		}
	}
	if got := b.After(1 << 30); got != b.Max {
		t.Errorf("After(2^30) = %s, want Max %s", got, b.Max)
	}
	if got := b.After(0); got != b.Initial {
		t.Errorf("After(0) = %s, want Initial %s", got, b.Initial)
	}
}

func TestCheckRefusesASpinningOrShrinkingBackoff(t *testing.T) {
	for _, b := range []Backoff{{0, time.Second}, {-time.Second, time.Second}, {time.Second, time.Millisecond}} {
		if err := b.Check("retry_backoff"); err == nil || !strings.HasPrefix(err.Error(), "retry_backoff: ") {
			t.Errorf("Check(%+v) = %v, want an error naming retry_backoff", b, err)
		}
	}
	if err := (Backoff{time.Second, time.Second}).Check("x"); err != nil {
		t.Errorf("Initial == Max: %v", err)
	}
}
