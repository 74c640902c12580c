package dedup

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// The summary logs once per interval in which something was counted, with
// that interval's figures, and nothing while idle.
func TestSummaryLogsCountsOfAnIntervalAndNothingWhenIdle(t *testing.T) {
	out := &harness.LogBuffer{}
	s := &Summary{Logf: func(f string, a ...any) { fmt.Fprintf(out, f+"\n", a...) }, Every: 100 * time.Millisecond}
	s.Add(3, 0)
	s.Add(0, 2)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), "passed") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "dedup_ledger: 3 passed, 2 duplicates skipped in the last 100ms") {
		t.Fatalf("first summary: %q", out.String())
	}
	time.Sleep(300 * time.Millisecond) // three idle intervals
	if n := strings.Count(out.String(), "passed"); n != 1 {
		t.Fatalf("%d summary lines after an idle period, want 1:\n%s", n, out.String())
	}
	s.Add(1, 0)
	deadline = time.Now().Add(5 * time.Second)
	for strings.Count(out.String(), "passed") < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "dedup_ledger: 1 passed, 0 duplicates skipped in the last 100ms") {
		t.Fatalf("second summary: %q", out.String())
	}
}
