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

// debConfig is the Debian package's default pipeline
// (/etc/reliable-mqtt/config.yaml) with its two broker URLs and its state
// directory replaced, as a user edits them.
func debConfig(t *testing.T, local, upstream, stateDir string) string {
	t.Helper()
	path := filepath.Join(harness.ModuleRoot(t), "packaging", "config.yaml")
	runCLI(t, "lint", path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	for from, to := range map[string]string{
		"tcp://127.0.0.1:1883":               local,
		"tcp://upstream-broker.invalid:1883": upstream,
		"/var/lib/reliable-mqtt/":            stateDir + "/",
	} {
		if !strings.Contains(cfg, from) {
			t.Fatalf("packaging/config.yaml no longer contains %q: update the test", from)
		}
		cfg = strings.ReplaceAll(cfg, from, to)
	}
	return cfg
}

// TestDebianDefaultPipelinePacksItsBacklog runs the .deb's default
// pipeline (lint-clean as shipped) between a local and an upstream
// mosquitto. While the upstream broker is down, readings on the local
// factory/# are stored (the local broker gets its PUBACKs); once it is
// back, the backlog goes up in frames, each reading under its own topic
// and event ID, none missing.
func TestDebianDefaultPipelinePacksItsBacklog(t *testing.T) {
	const n = 600
	local := harness.StartMosquitto(t, harness.MosquittoOptions{})
	upstream := harness.StartMosquitto(t, harness.MosquittoOptions{Persistence: true})
	// A persistent session upstream: what arrives while the test's
	// subscriber reconnects after the restart is kept for it.
	sub := harness.Subscribe(t, upstream.URL(), "deb-upstream-sub", false, "factory/#")
	gw := harness.RunPipeline(t, debConfig(t, local.URL(), upstream.URL(), t.TempDir()),
		harness.ProcOptions{Args: []string{"-s", "http.enabled=false", "-s", "output.reliable_mqtt_out.stats_interval=100ms"}})
	if !gw.WaitForLog("Input type reliable_mqtt_in is now active", 30*time.Second) {
		t.Fatal("the gateway's input never became active")
	}

	upstream.Stop()
	// Two topics, in runs: a frame holds consecutive readings of one topic.
	var payloads [2][][]byte
	for i := 1; i <= n; i++ {
		payloads[i*2/(n+1)] = append(payloads[i*2/(n+1)], fmt.Appendf(nil, `{"n":%d}`, i))
	}
	harness.Publish(t, local.URL(), "factory/line1", payloads[0])
	harness.Publish(t, local.URL(), "factory/line2", payloads[1])
	harness.Eventually(t, outWait, fmt.Sprintf("all %d readings in the gateway's outbox", n), func() bool {
		return outLastPending(gw.RunLog()) == n
	})
	upstream.Start()

	all := outUpTo(n)
	if !harness.PollProgress(outStall, outLimit, func() (int, bool) {
		got := outDeliveredSet(outDeliveries(t, sub))
		return len(got), len(outMissing(all, got)) == 0
	}) {
		t.Fatalf("upstream never got %v (first 20)", outMissing(all, outDeliveredSet(outDeliveries(t, sub))))
	}
	for _, m := range sub.Messages() {
		for _, d := range outDeliveriesOf(t, m.Payload) {
			if want := fmt.Sprintf("factory/line%d", 1+d.n*2/(n+1)); m.Topic != want {
				t.Fatalf("reading %d arrived on %s, want %s", d.n, m.Topic, want)
			}
		}
	}
	t.Logf("%d readings stored while upstream was down arrived in %d publishes, %d of them frames", n, sub.Count(), sub.Frames())
	if sub.Frames() == 0 {
		t.Fatal("the default pipeline sent no frame: it does not pack")
	}
}
