package harness

import (
	"strings"
	"testing"
)

// envCount runs EnvCount with a fatalRecorder (harness_test.go) in a
// goroutine of its own.
func envCount(t *testing.T, name string, def int) (int, string) {
	r := &fatalRecorder{TB: t}
	got := make(chan int, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		got <- EnvCount(r, name, def)
	}()
	<-done
	select {
	case n := <-got:
		return n, r.msg
	default:
		return 0, r.msg
	}
}

// EnvCount returns the default when the variable is unset, its value when
// it is a positive integer, and fails naming the variable otherwise.
func TestEnvCountTakesAPositiveIntegerAndRefusesAnythingElse(t *testing.T) {
	const name = "HARNESS_TEST_COUNT"
	t.Setenv(name, "")
	if n, msg := envCount(t, name, 7); n != 7 || msg != "" {
		t.Fatalf("unset: got %d (%q), want the default 7", n, msg)
	}
	t.Setenv(name, "250")
	if n, msg := envCount(t, name, 7); n != 250 || msg != "" {
		t.Fatalf("250: got %d (%q)", n, msg)
	}
	for _, bad := range []string{"0", "-3", "12k", "1e3"} {
		t.Setenv(name, bad)
		if _, msg := envCount(t, name, 7); !strings.Contains(msg, name+`="`+bad+`"`) {
			t.Errorf("%s=%s: failure %q, want one naming the variable and its value", name, bad, msg)
		}
	}
}
