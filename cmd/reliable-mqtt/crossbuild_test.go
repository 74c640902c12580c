package main

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// The binary builds for Windows and macOS too; crash points (internal/
// failpoint) must not tie it to Linux.
func TestBuildsForWindowsAndDarwin(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles Benthos twice")
	}
	for _, goos := range []string{"windows", "darwin"} {
		t.Run(goos, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "go", "build", "-o", os.DevNull, ".")
			cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64", "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("GOOS=%s go build ./cmd/reliable-mqtt: %v\n%s", goos, err, out)
			}
		})
	}
}
