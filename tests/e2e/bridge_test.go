package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// bridgeRig is the shipped chain — publisher → source broker → bridge →
// destination broker → consumer — across two mosquitto brokers, run as real
// processes from config/publisher.yaml, config/bridge.yaml and
// config/consumer.yaml. Every hop is confirmed end to end.
type bridgeRig struct {
	source, dest *harness.Mosquitto
	dataDir      string
	publisher    *harness.Proc
	bridge       *harness.Proc
	consumer     *harness.Proc
}

func startBridgeRig(t *testing.T, n int, custody bool) *bridgeRig {
	t.Helper()
	r := &bridgeRig{
		source:  harness.StartMosquitto(t, harness.MosquittoOptions{DurableOnKill: true, MaxInflight: 100}),
		dest:    harness.StartMosquitto(t, harness.MosquittoOptions{DurableOnKill: true, MaxInflight: 100}),
		dataDir: t.TempDir(),
	}
	env := []string{
		"SOURCE_BROKER=" + r.source.URL(), "EDGE_BROKER=" + r.source.URL(),
		"DEST_BROKER=" + r.dest.URL(), "CLOUD_BROKER=" + r.dest.URL(), "DATA_DIR=" + r.dataDir,
		fmt.Sprintf("BRIDGE_OUTBOX=%v", custody),
		// The generator stops after n readings; the process stays up so
		// that its outbox drains.
		"PUBLISH_INTERVAL=5ms", fmt.Sprintf("PUBLISH_COUNT=%d", n), "STATS_INTERVAL=200ms",
	}
	args := []string{"--log.level", "info", "-s", "http.enabled=false"}
	r.consumer = harness.RunPipeline(t, harness.ShippedConfig(t, "consumer.yaml"), harness.ProcOptions{Env: env, Args: args})
	r.bridge = harness.RunPipeline(t, harness.ShippedConfig(t, "bridge.yaml"), harness.ProcOptions{Env: env, Args: args})
	r.publisher = harness.RunPipeline(t, harness.ShippedConfig(t, "publisher.yaml"), harness.ProcOptions{Env: env, Args: args})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bridge log tail:\n%s", harness.TailLines(r.bridge.Log(), 40))
			t.Logf("publisher log tail:\n%s", harness.TailLines(r.publisher.Log(), 20))
			t.Logf("consumer log tail:\n%s", harness.TailLines(r.consumer.Log(), 20))
		}
	})
	return r
}

// finish waits until the consumer applied all n readings and the
// publisher's outbox is empty, then checks the consumer's table (the
// readings 1..n, each once) and the outbox file itself.
func (r *bridgeRig) finish(t *testing.T, n int) {
	t.Helper()
	db := filepath.Join(r.dataDir, "consumer.db")
	applied := func() int {
		total := 0
		for _, run := range harness.Applied(t, db) {
			total += run.Count
		}
		return total
	}
	deadline := time.Now().Add(90 * time.Second)
	for applied() < n && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	runs := harness.Applied(t, db)
	if len(runs) != 1 {
		t.Fatalf("the consumer applied readings of %d publisher runs, want 1: %v", len(runs), runs)
	}
	for id, run := range runs {
		if run.Count != n || run.Min != 1 || run.Max != n {
			t.Fatalf("run %s: the consumer applied %d readings, seq %d..%d; want exactly 1..%d", id, run.Count, run.Min, run.Max, n)
		}
	}
	r.drainPublisher(t)
}

// drainPublisher waits until the publisher's outbox is drained, stops the
// publisher and checks the outbox file itself.
func (r *bridgeRig) drainPublisher(t *testing.T) {
	t.Helper()
	harness.Eventually(t, 60*time.Second, "the publisher's outbox to drain", func() bool {
		return strings.Contains(harness.LastStatsLine(r.publisher.RunLog()), "; 0 pending (0 bytes)")
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
			// The shipped bridge packs: what it forwards must travel in
			// frames, so the kills fall while frames are in flight.
			forwarded := harness.Subscribe(t, r.dest.URL(), "bridge-kill-watch-"+name, false, "reliable/deliveries")
			rng := testRand(t, 7)
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
			if forwarded.Frames() == 0 {
				t.Fatalf("none of the %d publishes the bridge forwarded was a frame: the kills hit no frame in flight", len(forwarded.Messages()))
			}
			t.Logf("%d of %d forwarded publishes were frames", forwarded.Frames(), len(forwarded.Messages()))
		})
	}
}

// TestPackedPublisherKilledMidFrameLosesNothing: the shipped publisher packs
// waiting readings into frames (pack.max_events 64 in config/publisher.yaml)
// and is SIGKILLed repeatedly while frames are in flight. Each run's
// readings reach the consumer's table exactly once and without a gap
// (count = last sequence number, from 1), the last run all n of them, and
// the publisher's outbox drains: every reading accepted by a killed run
// was applied too.
func TestPackedPublisherKilledMidFrameLosesNothing(t *testing.T) {
	const n = 600
	r := startBridgeRig(t, n, false)
	watch := harness.Subscribe(t, r.source.URL(), "frame-watch", true, "reliable/ingress")
	if !strings.Contains(harness.ShippedConfig(t, "publisher.yaml"), "max_events: ${PACK_MAX_EVENTS:64}") {
		t.Fatal("config/publisher.yaml does not pack: the test would not test frames")
	}
	rng := testRand(t, 11)
	for kill := 0; kill < 3; kill++ {
		time.Sleep(time.Duration(400+rng.IntN(400)) * time.Millisecond)
		r.publisher.Kill()
		time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
		r.publisher.Restart()
	}
	db := filepath.Join(r.dataDir, "consumer.db")
	last := func() (harness.AppliedRun, int) {
		var newest string
		runs := harness.Applied(t, db)
		for id := range runs {
			newest = max(newest, id)
		}
		return runs[newest], len(runs)
	}
	harness.Eventually(t, 120*time.Second, "the last run's readings at the consumer", func() bool {
		run, _ := last()
		return run.Count >= n
	})
	r.drainPublisher(t)
	runs := harness.Applied(t, db)
	if len(runs) < 2 {
		t.Fatalf("the consumer saw %d publisher runs, want one per start (the kills did not land mid-stream)", len(runs))
	}
	for id, run := range runs {
		if run.Min != 1 || run.Count != run.Max {
			t.Fatalf("run %s: %d readings applied, seq %d..%d; want each of 1..%d exactly once", id, run.Count, run.Min, run.Max, run.Max)
		}
	}
	if run, _ := last(); run.Count != n {
		t.Fatalf("the last run applied %d readings, want %d", run.Count, n)
	}
	frames := watch.Frames()
	if frames == 0 {
		t.Fatalf("none of the %d publishes on reliable/ingress was a frame: the test did not test frames", watch.Count())
	}
	t.Logf("%d runs; %d of %d publishes on reliable/ingress were frames", len(runs), frames, watch.Count())
}
