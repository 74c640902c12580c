// Package rollback runs the previous release (commit prevCommit, built
// from git) and this build on the same files, both ways (issue 32): a
// device rolled back after an upgrade, then forward again. Old reads new —
// refused or read, and what the previous release set aside comes back
// whole with `outbox restore`; new reads old; and a file or record of a
// newer format stops this build at start with a message that says what
// to do.
package rollback

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// prevCommit is the previous release: the build that set aside every
// record with MQTT 5 properties (record version 3) as damaged.
const prevCommit = "f1d8cb40052e"

// buildTimeout bounds a cold build of the previous release.
const buildTimeout = 20 * time.Minute

// previousRelease returns the previous release's binary, built once from
// git (`git archive` of prevCommit, then go build) into
// ~/.cache/reliable-mqtt/release-<commit>/ and reused while its --version
// names that commit.
func previousRelease(t *testing.T) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cache, "reliable-mqtt", "release-"+prevCommit)
	bin := filepath.Join(dir, "reliable-mqtt")
	if out, err := run(t, time.Minute, "", bin, "--version"); err == nil && strings.Contains(out, "commit "+prevCommit) {
		return bin
	}
	root := harness.ModuleRoot(t)
	full, err := run(t, time.Minute, root, "git", "rev-parse", "--verify", prevCommit+"^{commit}")
	if err != nil {
		t.Fatalf("the previous release %s is not in this clone's history (a shallow clone? fetch it): %v\n%s", prevCommit, err, full)
	}
	full = strings.TrimSpace(full)
	src := t.TempDir()
	if out, err := run(t, time.Minute, root, "sh", "-c", fmt.Sprintf("git archive %s | tar -x -C %s", full, src)); err != nil {
		t.Fatalf("git archive %s: %v\n%s", full, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("building the previous release %s into %s (once; a cold build takes minutes)", prevCommit, dir)
	tmp := bin + ".tmp"
	ldflags := fmt.Sprintf("-X main.version=previous-release -X main.commit=%s", full)
	if out, err := run(t, buildTimeout, src, "go", "build", "-o", tmp, "-ldflags", ldflags, "./cmd/reliable-mqtt"); err != nil {
		t.Fatalf("building the previous release: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// run runs a command in dir, bounded by timeout, and returns its standard
// output; a failure's error carries its standard error too.
func run(t *testing.T, timeout time.Duration, dir, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		err = fmt.Errorf("%w: %s", err, stderr.String())
	}
	return string(out), err
}
