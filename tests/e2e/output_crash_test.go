package e2e

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// TestOutputSIGKILLMidStreamLosesNoAcceptedMessage runs the real binary as a
// publisher (window 1: stop-and-wait FIFO) and SIGKILLs it five times
// mid-stream, then lets it drain. Odd-numbered runs lose their connection
// for a while first, so they are killed with a backlog half drained.
//
// Every restart regenerates n = 1, 2, ... with the same event IDs
// (evt-<n>): a regenerated message is an idempotent repeat of its pending
// record, or — if that record was confirmed meanwhile — a new record and
// a real duplicate delivery, which at-least-once allows.
//
// What must hold:
//   - after each kill, every message that run accepted (ACCEPTED line) is
//     either delivered or still in the outbox file: nothing accepted is
//     lost by a crash, whatever the crash interrupted;
//   - every delivery of n carries event ID evt-<n>: IDs never change on resend;
//   - first deliveries arrive in increasing n: FIFO survives crashes and
//     resends (with window 1 nothing can overtake);
//   - in the end 1..count are all delivered and the outbox file is empty.
func TestOutputSIGKILLMidStreamLosesNoAcceptedMessage(t *testing.T) {
	outputSIGKILLMidStream(t, 1)
}

// TestOutputWithBatchingSIGKILLMidStreamLosesNoAcceptedMessage: the same
// with the output's batching policy, which regroups the source's batches
// of 10 into batches of 7 appended together: a batch is accepted only once
// the fsync that covers all of it returned.
func TestOutputWithBatchingSIGKILLMidStreamLosesNoAcceptedMessage(t *testing.T) {
	outputSIGKILLMidStream(t, 1, "batching: { count: 7, period: 5ms }")
}

// TestOutputPackedSIGKILLMidStreamLosesNoAcceptedMessage: the same with
// records packed into frames of up to 16 (confirm: broker, envelope:
// delivery: a frame's PUBACK confirms its records), a window of 64 records
// so that frames form, and kills that land while frames are in flight.
// Resends start again from the oldest unconfirmed record, so first
// deliveries still arrive in order.
func TestOutputPackedSIGKILLMidStreamLosesNoAcceptedMessage(t *testing.T) {
	if frames := outputSIGKILLMidStream(t, 64, "pack: { max_events: 16 }"); frames == 0 {
		t.Fatal("the subscriber got no frame: the test did not test packing")
	}
}

// outputSIGKILLMidStream runs the test with the output's window and extra
// output fields, and returns how many frames the subscriber got.
func outputSIGKILLMidStream(t *testing.T, window int, extra ...string) (frames int) {
	const count, kills = 5000, 5
	m := harness.StartMosquitto(t, harness.MosquittoOptions{MaxInflight: 1000})
	// A persistent session: a subscriber reconnect must not cost messages.
	sub := harness.Subscribe(t, m.URL(), "crash-sub", false, "crash/data")
	// The publisher reaches the broker through a proxy so that some runs
	// build a backlog (connection cut) and are killed while draining it.
	proxy := harness.NewProxy(t, m.Addr())
	path := filepath.Join(t.TempDir(), "outbox.db")
	pub := outPublisher{url: proxy.URL(), outboxPath: path, count: count, topic: "crash/data", window: window, batch: 10,
		extra: append([]string{"envelope: delivery"}, extra...)}
	p := harness.RunPipeline(t, pub.yaml(), harness.ProcOptions{})

	rng := testRand(t, 1)
	for k := 1; k <= kills; k++ {
		// Kill only once this run is writing, so every kill lands mid-stream.
		if !p.WaitForLog("ACCEPTED ", 30*time.Second) {
			t.Fatalf("run %d accepted nothing within 30s", k)
		}
		if k%2 == 1 {
			// Backlog: cut the path, let writes pile up in the outbox,
			// restore, and kill while the sender drains.
			proxy.Cut()
			time.Sleep(time.Duration(200+rng.IntN(600)) * time.Millisecond)
			proxy.Restore()
			time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		} else {
			time.Sleep(time.Duration(200+rng.IntN(600)) * time.Millisecond)
		}
		p.Kill()

		accepted := outAccepted(t, p.RunLog())
		inOutbox, _ := outOutboxContents(t, path, outFromDelivery)
		// Records confirmed just before the kill may still be on their way
		// from the broker to the subscriber; give them time, not forever.
		if !harness.Poll(10*time.Second, func() bool {
			return len(outMissing(accepted, inOutbox, outDeliveredSet(outDeliveries(t, sub)))) == 0
		}) {
			t.Fatalf("kill %d: accepted messages neither delivered nor in the outbox (lost): %v",
				k, outMissing(accepted, inOutbox, outDeliveredSet(outDeliveries(t, sub))))
		}
		t.Logf("kill %d: run accepted %d (up to n=%d), %d pending in the outbox, %d deliveries so far",
			k, len(accepted), outMax(accepted), len(inOutbox), sub.Count())
		p.Restart()
	}

	outWaitDrained(t, p, path, outFromDelivery, count, func() map[int]bool { return outDeliveredSet(outDeliveries(t, sub)) })

	ds := outDeliveries(t, sub)
	seen := map[int]bool{}
	last := 0
	for i, d := range ds {
		if want := "evt-" + strconv.Itoa(d.n); d.eventID != want {
			t.Fatalf("delivery %d: n=%d arrived with event ID %q, want %q", i, d.n, d.eventID, want)
		}
		if seen[d.n] {
			continue
		}
		seen[d.n] = true
		if d.n < last {
			t.Fatalf("delivery %d: n=%d delivered for the first time after n=%d: FIFO order broken", i, d.n, last)
		}
		last = d.n
	}
	for _, m := range sub.Messages() {
		if frame.Is(m.Payload) {
			frames++
		}
	}
	t.Logf("%d deliveries for %d messages (%d duplicates), %d publishes were frames", len(ds), count, len(ds)-count, frames)
	return frames
}

func outMax(set map[int]bool) int {
	m := 0
	for n := range set {
		m = max(m, n)
	}
	return m
}
