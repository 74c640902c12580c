package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BinaryEnv names an already-built reliable-mqtt to use instead of building.
const BinaryEnv = "RELIABLE_MQTT_BIN"

// buildTimeout bounds `go build`; a cold build of Benthos on 2 cores takes
// minutes, a warm one seconds.
const buildTimeout = 5 * time.Minute

var (
	buildOnce   sync.Once
	builtBinary string
	buildErr    error
)

// Binary returns the path of a reliable-mqtt executable: $RELIABLE_MQTT_BIN
// if set, else ./cmd/reliable-mqtt built once per test binary. A failed
// build fails every test that asks, with the compiler's output.
func Binary(t testing.TB) string {
	t.Helper()
	if p, ok := fromEnv(t, BinaryEnv); ok {
		return p
	}
	buildOnce.Do(func() { builtBinary, buildErr = buildBinary() })
	if buildErr != nil {
		t.Fatalf("harness: %v", buildErr)
	}
	return builtBinary
}

// ModuleRoot walks up from the working directory to the directory holding
// go.mod.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return root
}

// ShippedConfig is the text of config/<name>, a config the project ships.
func ShippedConfig(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ModuleRoot(t), "config", name))
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return string(b)
}

func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("find module root: no go.mod in %s or any parent", wd)
		}
	}
}

// buildBinary builds into <tmp>/reliable-mqtt-harness/<pid>/. The directory
// cannot be a t.TempDir (it outlives the test that asked first), so each
// build removes the directories of test binaries that have exited.
func buildBinary() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	goExe, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("build reliable-mqtt: go not on PATH (%v); put it there or set %s", err, BinaryEnv)
	}
	base := filepath.Join(os.TempDir(), "reliable-mqtt-harness")
	removeStaleBuilds(base)
	dir := filepath.Join(base, strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("build reliable-mqtt: create %s: %w", dir, err)
	}
	out := filepath.Join(dir, "reliable-mqtt")
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goExe, "build", "-o", out, "./cmd/reliable-mqtt")
	cmd.Dir = root
	if output, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/reliable-mqtt in %s failed (%v):\n%s", root, err, output)
	}
	return out, nil
}

// removeStaleBuilds deletes per-pid build dirs whose process is gone.
func removeStaleBuilds(base string) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(filepath.Join(base, e.Name()))
		}
	}
}

// fromEnv returns the executable the variable env names, if set; a path
// that does not exist fails the test.
func fromEnv(t testing.TB, env string) (string, bool) {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		return "", false
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("harness: %s=%s: %v", env, p, err)
	}
	return p, true
}
