package harness

import (
	"bytes"
	"strings"
	"sync"
)

// LogBuffer collects a component's log output (e.g. through
// slog.NewTextHandler) so that a test can look for a line while the
// component is still writing.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Contains reports whether sub was written.
func (l *LogBuffer) Contains(sub string) bool { return strings.Contains(l.String(), sub) }

// TailLines returns the last n lines of s, for a failure message.
func TailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// LastStatsLine is the newest "Outbox ...: ... pending" line of a log.
func LastStatsLine(log string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], " pending (") {
			return lines[i]
		}
	}
	return ""
}
