package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// bridgeRig is the shipped publisher → bridge chain across two mosquitto
// brokers, run as real processes from config/publisher.yaml and
// config/bridge.yaml.
type bridgeRig struct {
	source, dest *harness.Mosquitto
	dataDir      string
	publisher    *harness.Proc
	bridge       *harness.Proc
	sub          *harness.Subscriber
}

func shippedConfig(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(harness.ModuleRoot(t), "config", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func startBridgeRig(t *testing.T, n int, custody bool) *bridgeRig {
	t.Helper()
	r := &bridgeRig{
		source:  harness.StartMosquitto(t, harness.MosquittoOptions{DurableOnKill: true, MaxInflight: 100}),
		dest:    harness.StartMosquitto(t, harness.MosquittoOptions{DurableOnKill: true, MaxInflight: 100}),
		dataDir: t.TempDir(),
	}
	// A persistent destination subscriber: what the destination broker
	// queues while the subscriber is disconnected still reaches it.
	r.sub = harness.Subscribe(t, r.dest.URL(), "bridge-test-dest", false, "factory/#")
	env := []string{
		"SOURCE_BROKER=" + r.source.URL(), "EDGE_BROKER=" + r.source.URL(),
		"DEST_BROKER=" + r.dest.URL(), "DATA_DIR=" + r.dataDir,
		fmt.Sprintf("BRIDGE_OUTBOX=%v", custody),
		"PUBLISH_INTERVAL=5ms", "STATS_INTERVAL=200ms",
	}
	r.bridge = harness.RunPipeline(t, shippedConfig(t, "bridge.yaml"), harness.ProcOptions{Env: env, Args: []string{"--log.level", "info"}})
	// The shipped generator runs forever; stop generating after n events but
	// keep the process up so that its sender can drain the outbox.
	pub := strings.Replace(shippedConfig(t, "publisher.yaml"), "    count: ${PUBLISH_COUNT:0}\n",
		"    count: 0\n", 1)
	pub = strings.Replace(pub, `      root = {"machine": "press-1", "temperature": random_int(min: 15, max: 30), "seq": counter()}`,
		fmt.Sprintf("      let n = counter()\n      root = if $n > %d { deleted() } else { {\"machine\": \"press-1\", \"seq\": $n} }", n), 1)
	if !strings.Contains(pub, "deleted()") {
		t.Fatal("config/publisher.yaml changed shape; update this test's generator limit")
	}
	r.publisher = harness.RunPipeline(t, pub, harness.ProcOptions{Env: env, Args: []string{"--log.level", "info"}})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bridge log tail:\n%s", tailLines(r.bridge.Log(), 40))
			t.Logf("publisher log tail:\n%s", tailLines(r.publisher.Log(), 20))
		}
	})
	return r
}

// distinctAtDest returns the event IDs delivered at the destination.
func (r *bridgeRig) distinctAtDest(t *testing.T) map[string]bool { return deliveredIDs(t, r.sub) }

// deliveredIDs returns the event IDs sub received, and fails the test on a
// message that is not a valid delivery envelope.
func deliveredIDs(t *testing.T, sub *harness.Subscriber) map[string]bool {
	ids := map[string]bool{}
	for _, m := range sub.Messages() {
		d, err := envelope.DecodeDelivery(m.Payload)
		if err != nil {
			t.Fatalf("destination got a non-envelope on %s: %v", m.Topic, err)
		}
		ids[d.EventID] = true
	}
	return ids
}

// finish waits until all n events reached the destination and the
// publisher's outbox is empty, then checks the outbox file itself.
func (r *bridgeRig) finish(t *testing.T, n int) {
	t.Helper()
	harness.Eventually(t, 90*time.Second, fmt.Sprintf("%d distinct events at the destination", n), func() bool {
		return len(r.distinctAtDest(t)) >= n
	})
	if got := len(r.distinctAtDest(t)); got != n {
		t.Fatalf("%d distinct events at the destination, want exactly %d", got, n)
	}
	harness.Eventually(t, 60*time.Second, "the publisher's outbox to drain", func() bool {
		return strings.Contains(lastStatsLine(r.publisher.RunLog()), "; 0 pending (0 bytes)")
	})
	if err := r.publisher.Stop(15 * time.Second); err != nil {
		t.Fatalf("publisher stop: %v", err)
	}
	ob, err := outbox.Open(filepath.Join(r.dataDir, "publisher-outbox.db"), outbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	if st := ob.Stats(); st.Pending != 0 {
		t.Fatalf("publisher outbox holds %d records after every event was delivered", st.Pending)
	}
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// lastStatsLine is the newest "Outbox ...: ... pending" line of a log.
func lastStatsLine(log string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], " pending (") {
			return lines[i]
		}
	}
	return ""
}

func TestBridgeDeliversEveryEventAndThePublisherOutboxDrains(t *testing.T) {
	for _, custody := range []bool{false, true} {
		name := map[bool]string{false: "direct", true: "custody"}[custody]
		t.Run(name, func(t *testing.T) {
			const n = 200
			r := startBridgeRig(t, n, custody)
			r.finish(t, n)
		})
	}
}

func TestBridgeLosesNothingWhenKilledRepeatedlyAndTheDestinationRestarts(t *testing.T) {
	for _, custody := range []bool{false, true} {
		name := map[bool]string{false: "direct", true: "custody"}[custody]
		t.Run(name, func(t *testing.T) {
			const n = 400
			r := startBridgeRig(t, n, custody)
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
			for kill := 0; kill < 4; kill++ {
				time.Sleep(time.Duration(300+rng.IntN(500)) * time.Millisecond)
				r.bridge.Kill()
				if kill == 1 {
					r.dest.Restart() // mid-stream, while the bridge is down
				}
				time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
				r.bridge.Restart()
			}
			r.finish(t, n)
		})
	}
}
