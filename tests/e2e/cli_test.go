package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// runCLI runs the real binary in the module root and returns its output.
func runCLI(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, harness.Binary(t), args...)
	cmd.Dir = harness.ModuleRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("reliable-mqtt %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Benthos's own CLI works in our binary and knows our plugins.
func TestCLIListsLintsAndEchoesWithOurPlugins(t *testing.T) {
	if out := runCLI(t, "--version"); !strings.Contains(out, "Version:") {
		t.Fatalf("--version printed %q", out)
	}
	list := runCLI(t, "list", "inputs", "outputs", "processors")
	for _, name := range []string{"reliable_mqtt_in", "reliable_mqtt_out", "dedup_ledger", "generate"} {
		if !strings.Contains(list, name) {
			t.Errorf("`list` does not show %s", name)
		}
	}
	configs, err := filepath.Glob(filepath.Join(harness.ModuleRoot(t), "config", "*.yaml"))
	if err != nil || len(configs) == 0 {
		t.Fatalf("no configs: %v", err)
	}
	runCLI(t, append([]string{"lint"}, configs...)...)
	echo := runCLI(t, "-c", filepath.Join("config", "bridge.yaml"), "echo")
	if !strings.Contains(echo, "reliable_mqtt_in:") || !strings.Contains(echo, "ack_topic: reliable/acks") {
		t.Fatalf("`echo` of the bridge config:\n%s", echo)
	}
}

// The README's quickstart command: publisher, bridge and consumer in one
// process on two embedded brokers. Readings must come out of the consumer
// and the publisher's outbox must report confirmations.
func TestQuickstartDeliversEndToEndOnEmbeddedBrokers(t *testing.T) {
	root := harness.ModuleRoot(t)
	dir := t.TempDir()
	cmd := exec.Command(harness.Binary(t), "streams", "--no-api",
		"-o", filepath.Join(root, "resources", "quickstart-root.yaml"),
		filepath.Join(root, "config", "publisher.yaml"),
		filepath.Join(root, "config", "bridge.yaml"),
		filepath.Join(root, "config", "consumer.yaml"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PUBLISH_INTERVAL=50ms", "STATS_INTERVAL=1s")
	logs := &harness.LogBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	// Bounds Wait below: once the process is gone, pipes a leftover child
	// still holds are closed after this long instead of waited for.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("the quickstart did not stop within 15 s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("quickstart log:\n%s", logs.String())
		}
	}()
	harness.Eventually(t, 60*time.Second, "readings delivered to the consumer and confirmed at the publisher", func() bool {
		return strings.Count(logs.String(), "delivered event ") >= 10 &&
			strings.Contains(logs.String(), "confirmed in the last")
	})
	if _, err := os.Stat(filepath.Join(dir, "reliable-mqtt-data", "publisher-outbox.db")); err != nil {
		t.Fatalf("the publisher's outbox file is missing: %v", err)
	}
}
