package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// outboxPipeline is a pipeline whose reliable_mqtt_out publishes to topic
// through an outbox at path; extra lines are added to the output's fields.
// Its input makes one message and then waits for an hour, so a process
// that starts keeps running.
func outboxPipeline(path, topic string, extra ...string) string {
	return fmt.Sprintf(`http: { enabled: false }
input:
  generate: { interval: 1h, mapping: 'root = {"n": 1}' }
output:
  reliable_mqtt_out:
    urls: [ "tcp://127.0.0.1:1" ]
    topic: %q
    outbox: { path: %q }
%s`, topic, path, outputFields(extra))
}

func outputFields(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}

// refusedAtStart runs yaml and asserts the process exits non-zero within
// a bounded time with a log containing every one of want.
func refusedAtStart(t *testing.T, yaml string, args []string, want ...string) {
	t.Helper()
	p := harness.RunPipeline(t, yaml, harness.ProcOptions{Args: args})
	code, err := p.Wait(2 * time.Minute)
	if err != nil {
		t.Fatalf("%v: a configuration that can never work must stop the process", err)
	}
	if code == 0 {
		t.Fatalf("exit code 0, want non-zero; log:\n%s", p.Log())
	}
	for _, w := range want {
		if !strings.Contains(p.Log(), w) {
			t.Fatalf("log lacks %q:\n%s", w, p.Log())
		}
	}
}

// An outbox path that can never work stops the process at start with a
// non-zero exit and a message naming the file: a directory, a path below a
// regular file, a file that is not a bbolt file, a file another process
// holds. The refused files are left as they were.
func TestOutboxThatCanNeverWorkStopsTheProcessAtStart(t *testing.T) {
	dir := t.TempDir()

	t.Run("directory", func(t *testing.T) {
		path := filepath.Join(dir, "adir")
		if err := os.Mkdir(path, 0o755); err != nil {
			t.Fatal(err)
		}
		refusedAtStart(t, outboxPipeline(path, "t/x"), nil, path)
	})
	t.Run("parent is a file", func(t *testing.T) {
		parent := filepath.Join(dir, "afile")
		if err := os.WriteFile(parent, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(parent, "outbox.db")
		refusedAtStart(t, outboxPipeline(path, "t/x"), nil, path, "not a directory")
	})
	t.Run("foreign file", func(t *testing.T) {
		path := filepath.Join(dir, "foreign.db")
		garbage := []byte(strings.Repeat("not a database\n", 500))
		if err := os.WriteFile(path, garbage, 0o644); err != nil {
			t.Fatal(err)
		}
		refusedAtStart(t, outboxPipeline(path, "t/x"), nil, path)
		if got, err := os.ReadFile(path); err != nil || string(got) != string(garbage) {
			t.Fatalf("the refused file was changed (err %v)", err)
		}
	})
	t.Run("locked by another process", func(t *testing.T) {
		path := filepath.Join(dir, "held.db")
		// The holder never finishes its one message (nothing listens on
		// port 1), so it keeps the file open until the test ends.
		holder := harness.RunPipeline(t, outboxPipeline(path, "t/x"), harness.ProcOptions{})
		harness.Eventually(t, 2*time.Minute, "the holder to open its outbox", func() bool {
			return strings.Contains(holder.Log(), "Output type reliable_mqtt_out is now active")
		})
		refusedAtStart(t, outboxPipeline(path, "t/x"), nil, path, "locked by another process")
		if !holder.Running() {
			t.Fatal("the holder exited")
		}
	})
}

// Enumerations are checked in code, so that a typo cannot run as the
// default under --chilled (which skips the linter); publish topics are
// checked at start rather than looping on a refused PUBLISH.
func TestMisconfiguredOutputStopsTheProcessEvenWhenChilled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	cases := []struct {
		name, topic string
		extra       []string
		want        []string
	}{
		{"confirm typo", "t/x", []string{"confirm: end-to-end"}, []string{`confirm: "end-to-end" is not one of broker, end_to_end`}},
		{"envelope typo", "t/x", []string{"envelope: deliver"}, []string{`envelope: "deliver" is not one of none, delivery`}},
		{"wildcard data_topic", "t/x", []string{"confirm: end_to_end", "data_topic: d/+"}, []string{`data_topic "d/+"`, "wildcard"}},
		{"wildcard topic", "t/#", nil, []string{`topic "t/#"`, "wildcard"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			refusedAtStart(t, outboxPipeline(path, c.topic, c.extra...), []string{"--chilled"}, c.want...)
		})
	}
}

// An embedded broker that could never start — a listener beyond loopback
// without users — stops the process at start with the reason, like every
// other configuration that can never work, instead of being retried
// forever. (192.0.2.1 is a documentation address: nothing is bound.)
func TestEmbeddedBrokerBeyondLoopbackWithoutUsersStopsAtStart(t *testing.T) {
	yaml := `
http:
  enabled: false
input:
  reliable_mqtt_in:
    urls: [ "embedded://?dir=./broker&listen=192.0.2.1:1883" ]
    client_id: open-broker
    topics: [ "t/#" ]
output:
  drop: {}
`
	refusedAtStart(t, yaml, nil, "listen=192.0.2.1:1883 accepts connections from other hosts", "add users=FILE")
}
