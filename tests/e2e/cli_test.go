package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
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
