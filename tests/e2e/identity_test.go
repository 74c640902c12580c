package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The binary presents itself as reliable-mqtt: in its help, its version and
// the service name on every log line, not as Benthos.
func TestCLINamesReliableMQTTInHelpVersionAndLogs(t *testing.T) {
	help := runCLI(t, "--help")
	for _, want := range []string{
		"reliable-mqtt - MQTT pipelines that keep every message",
		"Documentation: https://github.com/reliable-mqtt/reliable-mqtt",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("--help lacks %q:\n%s", want, help)
		}
	}
	if strings.Contains(help, "benthos.dev") {
		t.Errorf("--help links benthos.dev:\n%s", help)
	}
	if v := runCLI(t, "--version"); !strings.HasPrefix(v, "Version: ") || strings.Contains(v, "0.1.0-dev") {
		t.Errorf("--version printed %q", v)
	}

	conf := filepath.Join(t.TempDir(), "once.yaml")
	yaml := "http: {enabled: false}\n" +
		"input: {generate: {count: 1, interval: '', mapping: 'root = \"x\"'}}\n" +
		"output: {drop: {}}\n"
	if err := os.WriteFile(conf, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := runCLI(t, "-c", conf)
	if !strings.Contains(logs, "@service=reliable-mqtt") || strings.Contains(logs, "@service=benthos") {
		t.Errorf("log lines do not name the service reliable-mqtt:\n%s", logs)
	}
}
