package mqttin

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// QoS 0 has no broker window to bound it: beyond receive_buffer_size the
// oldest QoS 0 messages are dropped, with a warning.
func TestQoS0CappedAtReceiveBufferDroppingOldest(t *testing.T) {
	b := startBroker(t)
	ti := openInput(t, inputYAML(b.URL(), "qos0", []string{"z/#"}, "qos: 0", "clean_session: true", "receive_buffer_size: 3"))
	publish(t, b.URL(), "z/x", numbered("m", 10)...)
	harness.Eventually(t, 5*time.Second, "the drop warning", func() bool {
		return ti.logs.Contains("Dropped") && ti.logs.Contains("receive_buffer_size (3)")
	})
	harness.Eventually(t, 5*time.Second, "all 10 received", func() bool {
		queue := ti.in.in.Queued()
		return len(queue) == 3 && string(queue[2].Payload()) == "m9"
	})
	for _, want := range []string{"m7", "m8", "m9"} {
		msg, _ := ti.read()
		if body(msg) != want || meta(msg, metaQoS) != "0" {
			t.Fatalf("read %q at qos %s, want %q at qos 0", body(msg), meta(msg, metaQoS), want)
		}
	}
}

// The network reader never waits for the pipeline: with a 1 s keepalive
// and a pipeline that reads nothing for 3 s while messages keep arriving,
// the connection stays up (a blocked reader would miss its PINGRESPs).
func TestSlowPipelineKeepsConnectionAlive(t *testing.T) {
	b := startBroker(t)
	ti := openInput(t, inputYAML(b.URL(), "slow", []string{"s/#"}, "keepalive: 1s"))
	first := ti.in.client.Current()
	for i := 0; i < 6; i++ {
		publish(t, b.URL(), "s/x", numbered("m", 50)...)
		time.Sleep(500 * time.Millisecond)
	}
	if !first.Alive() || ti.in.client.Current() != first {
		t.Fatalf("the connection was lost while the pipeline was slow:\n%s", ti.logs.String())
	}
	queued := func() int {
		return len(ti.in.in.Queued())
	}
	// mosquitto's window in these tests: nothing is acked, so 100 are in flight.
	harness.Eventually(t, 10*time.Second, "the broker's in-flight window of 100 waiting", func() bool { return queued() == 100 })
	time.Sleep(200 * time.Millisecond)
	if n := queued(); n != 100 {
		t.Fatalf("%d messages waiting, want exactly the broker's in-flight window of 100", n)
	}
	for range 300 {
		ti.readAck()
	}
}

// Rejected QoS 0 messages wait for their retry in a list bounded like the
// queue: a pipeline that rejects everything cannot grow it with the
// incoming rate.
func TestRejectedQoS0RetriesAreBounded(t *testing.T) {
	b := startBroker(t)
	ti := openInput(t, inputYAML(b.URL(), "qos0-retry", []string{"r/#"}, "qos: 0", "clean_session: true", "receive_buffer_size: 3",
		"retry_backoff: { initial_interval: 1m, max_interval: 1m }"))
	for i := range 8 {
		// One at a time, so that none is dropped from the queue itself.
		publish(t, b.URL(), "r/x", fmt.Sprintf("m%d", i))
		_, ack := ti.read()
		if err := ack(context.Background(), errors.New("output down")); err != nil {
			t.Fatal(err)
		}
	}
	retrying, counted := ti.in.in.Retrying()
	if retrying != 3 || counted != 3 {
		t.Fatalf("%d rejected QoS 0 messages wait for a retry (counted %d), want receive_buffer_size = 3", retrying, counted)
	}
	if !ti.logs.Contains("Dropping a rejected QoS 0 message") {
		t.Fatal("no warning for the dropped QoS 0 retries")
	}
}
