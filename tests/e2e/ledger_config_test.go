package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// The dedup_ledger example configs carry `benthos test` cases; run them with
// the real binary, each time on a fresh ledger directory (the ledger
// persists, so a reused directory would turn the tests' first copies into
// duplicates).
func TestLedgerConfigUnitTestsPass(t *testing.T) {
	root := harness.ModuleRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, harness.Binary(t), "test",
		filepath.Join("config", "ledger_relay.yaml"),
		filepath.Join("config", "ledger_notify.yaml"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "LEDGER_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("reliable-mqtt test failed: %v\n%s", err, out)
	}
	for _, cfg := range []string{"ledger_relay.yaml", "ledger_notify.yaml"} {
		if !strings.Contains(string(out), "Test 'config/"+cfg+"' succeeded") {
			t.Fatalf("no success line for %s:\n%s", cfg, out)
		}
	}
}
