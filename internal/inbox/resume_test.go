package inbox

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

type infoLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *infoLog) Infof(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *infoLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// A resumed session is reported once, counting the messages of the newest
// connection only; a connection without a kept session is not reported.
func TestResumeLog(t *testing.T) {
	subs, err := ParseSubscriptions([]string{"a/#"})
	if err != nil {
		t.Fatal(err)
	}
	log := &infoLog{}
	r := NewResumeLog(Config{ClientID: "c1", Topics: []string{"a/#"}, Subs: subs}, log)
	r.OnMessage(1, &testMsg{topic: "a/old"}) // an older connection's
	r.OnMessage(2, &testMsg{topic: "a/1"})   // before OnConnect: counted
	r.OnConnect(2, true)
	r.OnMessage(2, &testMsg{topic: "a/2", dup: true})
	r.OnMessage(2, &testMsg{topic: "b/1"}) // matches no topic: held
	r.OnMessage(1, &testMsg{topic: "a/late"})
	r.OnConnect(3, false) // no session kept: not reported

	deadline := time.Now().Add(resumeWindow + 5*time.Second)
	for len(log.get()) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	lines := log.get()
	if len(lines) != 1 {
		t.Fatalf("log lines %q, want one", lines)
	}
	want := `client "c1": the broker sent 3 messages in its first 5s (1 marked as redeliveries); 1 matched none of topics [a/#]`
	if !strings.Contains(lines[0], want) {
		t.Errorf("log line %q, want it to contain %q", lines[0], want)
	}
}
