package harness

import (
	"os"
	"strconv"
	"testing"
)

// EnvCount is the size a test reads from the environment variable name
// (readings, rounds, cuts): def when it is unset, and a test failure
// naming the variable when it holds anything but a positive integer, so a
// typo never runs the default silently.
func EnvCount(t testing.TB, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}
