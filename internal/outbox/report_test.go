package outbox

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type lines []string

func (l *lines) add(f string, a ...any)    { *l = append(*l, fmt.Sprintf(f, a...)) }
func (l *lines) Errorf(f string, a ...any) { l.add("ERROR "+f, a...) }
func (l *lines) Warnf(f string, a ...any)  { l.add("WARN "+f, a...) }
func (l *lines) Infof(f string, a ...any)  { l.add("INFO "+f, a...) }

// ReportStart says whether an outbox resumes a backlog, and how large.
func TestReportStart(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "ob.db"), Options{})
	var empty lines
	o.ReportStart(&empty)
	if len(empty) != 1 || !strings.Contains(empty[0], "INFO outbox ") || !strings.HasSuffix(empty[0], ": no pending records") {
		t.Errorf("empty outbox reported %q", empty)
	}
	appendT(t, o, "e1", "t", "abc")
	appendT(t, o, "e2", "t", "de")
	var backlog lines
	o.ReportStart(&backlog)
	if len(backlog) != 1 || !strings.Contains(backlog[0], "resuming 2 pending records (") || !strings.Contains(backlog[0], o.Path()) {
		t.Errorf("outbox with two records reported %q", backlog)
	}
}

// Watch reports the stats at once and asks for a summary once every has
// passed; it stops when ctx ends.
func TestWatch(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "ob.db"), Options{})
	appendT(t, o, "e1", "t", "abc")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var calls, reports int
	<-o.Watch(ctx, 20*time.Millisecond, func(st Stats, report bool) {
		if calls == 0 && (report || st.Pending != 1) {
			t.Errorf("first call: pending %d, report %v; want 1 and no report yet", st.Pending, report)
		}
		calls++
		if report {
			reports++
			cancel()
		}
	})
	if reports != 1 || ctx.Err() != context.Canceled {
		t.Fatalf("%d calls, %d reports, ctx %v: want a report before the 10 s bound", calls, reports, ctx.Err())
	}
}
