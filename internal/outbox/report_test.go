package outbox

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
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
