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
