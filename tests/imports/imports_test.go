// Package imports checks the import rules between the rooms of the
// module with `go list -deps`, so that a package's doc ("without
// Benthos", "the input's engine") and what it links cannot drift apart.
package imports

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/reliable-mqtt/reliable-mqtt/"

// root is the module's directory (this file is tests/imports/imports_test.go).
func root(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// list runs `go list` in the module root with args and returns its
// non-empty lines.
func list(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %v: %v\n%s", args, err, ee.Stderr)
		}
		t.Fatalf("go list %v: %v", args, err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// deps are the packages pkg links (`go list -deps`, tests excluded).
func deps(t *testing.T, pkg string) []string { return list(t, "-deps", "./"+pkg) }

// The engines and the wire's leaf packages say they work without Benthos;
// they must not link it, not even through another package.
func TestEnginesAndWirePackagesLinkNoBenthos(t *testing.T) {
	for _, pkg := range []string{
		"internal/mqttmsg", "internal/codec", "internal/properties",
		"internal/mqttclient", "internal/sender", "internal/inbox",
		"internal/envelope", "internal/outbox", "internal/backoff",
		"internal/frame",
	} {
		for _, d := range deps(t, pkg) {
			if strings.HasPrefix(d, "github.com/redpanda-data/benthos/") {
				t.Errorf("%s links Benthos (%s): its Benthos side belongs in a plugin package (plugin/internal/mqttconf for the connection's spec)", pkg, d)
				break
			}
		}
	}
}

// internal/mqttmsg is the wire's leaf: it names a PUBLISH for every other
// package, so it imports nothing but the standard library.
func TestMqttmsgIsALeaf(t *testing.T) {
	for _, imp := range list(t, "-f", `{{join .Imports "\n"}}`, "./internal/mqttmsg") {
		if strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") {
			t.Errorf("internal/mqttmsg imports %s; it must import only the standard library", imp)
		}
	}
}

// The input links no part of the output's engine. bbolt reaches it only
// through the embedded broker's store (embedded://) and the transaction
// participants beside the delivery hooks in internal/commit.
func TestInputLinksNoOutputEngine(t *testing.T) {
	ds := deps(t, "plugin/mqttin")
	for _, out := range []string{"internal/sender", "internal/outbox", "internal/boltfile", "plugin/mqttout"} {
		if slices.Contains(ds, module+out) {
			t.Errorf("plugin/mqttin links %s, a part of the output", out)
		}
	}
	var via []string
	for _, line := range list(t, "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./plugin/mqttin") {
		f := strings.Fields(line)
		if strings.HasPrefix(f[0], module) && slices.Contains(f[1:], "go.etcd.io/bbolt") {
			via = append(via, strings.TrimPrefix(f[0], module))
		}
	}
	slices.Sort(via)
	if want := []string{"internal/commit", "internal/embedded"}; !slices.Equal(via, want) {
		t.Errorf("bbolt reaches plugin/mqttin through %v, want only %v", via, want)
	}
}

// A client starts no broker: embedded.StartClient starts the broker of an
// embedded:// URL beside it, so the connection layer links no mochi.
func TestClientLinksNoBroker(t *testing.T) {
	for _, d := range deps(t, "internal/mqttclient") {
		if d == module+"internal/embedded" || strings.HasPrefix(d, "github.com/mochi-mqtt/") {
			t.Errorf("internal/mqttclient links %s: brokers are started beside the client (embedded.StartClient), not by it", d)
		}
	}
}

// The Prometheus exporter and dedup_ledger have nothing to do with MQTT:
// they link no MQTT client, neither paho nor mochi (their generic spec
// helpers are plugin/internal/conffield, not mqttconf).
func TestExporterAndLedgerLinkNoMQTT(t *testing.T) {
	for _, pkg := range []string{"plugin/prommetrics", "plugin/ledger", "plugin/internal/conffield"} {
		for _, d := range deps(t, pkg) {
			if strings.HasPrefix(d, "github.com/eclipse/paho") || strings.HasPrefix(d, "github.com/mochi-mqtt/") ||
				d == module+"internal/mqttclient" || d == module+"internal/embedded" || d == module+"plugin/internal/mqttconf" {
				t.Errorf("%s links %s: it needs no MQTT client", pkg, d)
			}
		}
	}
}
