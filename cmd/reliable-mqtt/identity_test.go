package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestBuildStampPrefersLinkerStamps(t *testing.T) {
	defer func(v, c, d string) { version, commit, date = v, c, d }(version, commit, date)
	version, commit, date = "v1.2.3", "0123456789abcdef0123", "2026-01-02T03:04:05Z"
	ver, built := buildStamp()
	if ver != "v1.2.3 (commit 0123456789ab)" || built != "2026-01-02T03:04:05Z" {
		t.Fatalf("buildStamp() = %q, %q", ver, built)
	}
}

func TestBuildStampSaysDevelWithoutATag(t *testing.T) {
	defer func(v, c, d string) { version, commit, date = v, c, d }(version, commit, date)
	version, commit, date = "", "0123456789abcdef0123", ""
	if ver, _ := buildStamp(); ver != "devel (commit 0123456789ab)" {
		t.Fatalf("untagged buildStamp() = %q", ver)
	}
	for v, want := range map[string]bool{
		"v1.2.3": true, "v1.2.4-0.20261203120000-0123456789ab": true, "v1.2.3+dirty": true,
		"v0.0.0-20261203120000-0123456789ab": false, "(devel)": false, "": false,
	} {
		if tagged(v) != want {
			t.Errorf("tagged(%q) = %v, want %v", v, !want, want)
		}
	}
}

// THIRD_PARTY must name every module linked into the binary at the version
// go.mod selects; tools/third-party.sh rewrites it.
func TestThirdPartyNamesEveryLinkedModule(t *testing.T) {
	notice, err := os.ReadFile("../../THIRD_PARTY")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-deps",
		"-f", `{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}`, ".")
	cmd.Env = append(os.Environ(), "GOOS=linux", "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	seen := map[string]bool{}
	for _, mod := range strings.Fields(strings.ReplaceAll(string(out), " ", "@")) {
		if seen[mod] {
			continue
		}
		seen[mod] = true
		if !strings.Contains(string(notice), "\n"+strings.Replace(mod, "@", " ", 1)+"\nLicense: ") {
			t.Errorf("THIRD_PARTY has no entry for %s: run tools/third-party.sh", mod)
		}
	}
	if len(seen) == 0 {
		t.Fatal("go list -deps named no modules")
	}
}
