package tracing

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

const crashEvents = 5 // ev-01 … ev-05, stored and unconfirmed when the publisher is killed

// crashPublisherYAML is a publisher whose records stay unconfirmed while no
// bridge runs (confirm: end_to_end). With write it writes ev-01 … ev-05
// and logs their tracing_id(); without, it writes nothing and only drains
// its outbox. The outbox logs its pending count every second.
func crashPublisherYAML(c chain, broker, collector string, write bool) string {
	mapping := `root = deleted()`
	if write {
		mapping = `let seq = counter()
      meta event_id = "ev-%02d".format($seq)
      root = if $seq > ` + fmt.Sprint(crashEvents) + ` { deleted() } else { { "seq": $seq } }`
	}
	return publisherWith(c, broker, collector, mapping, "ack_timeout: 2s", "stats_interval: 1s")
}

var pendingLine = regexp.MustCompile(`; (\d+) pending \(`)

// A record written before a crash is sent after the restart with the trace
// context stored with it (MQTT 5: its user properties; 3.1.1 with
// trace_context: envelope: its envelope), so the bridge's and the
// consumer's spans join the trace of the original write, not a trace of
// the restarted process; packed, the records go in frames after the
// restart and each event keeps its own trace.
func TestARecordSentAfterACrashStaysInTheTraceOfItsWrite(t *testing.T) {
	for name, c := range map[string]chain{"MQTT 5": mqtt5, "MQTT 3.1.1 with trace_context envelope": mqtt311Trace, "MQTT 5, packed": mqtt5Packed} {
		t.Run(name, func(t *testing.T) { checkCrash(t, c) })
	}
}

func checkCrash(t *testing.T, c chain) {
	jaeger := harness.StartJaeger(t)
	edge := harness.StartMosquitto(t, harness.MosquittoOptions{})
	cloud := harness.StartMosquitto(t, harness.MosquittoOptions{})
	args := []string{"--log.level", "info", "-s", "http.enabled=false"}
	dir := t.TempDir()

	// No bridge yet: the broker PUBACKs the envelopes, nobody ACKs them,
	// so every record stays in the outbox.
	first := harness.RunPipeline(t, crashPublisherYAML(c, edge.URL(), jaeger.OTLPHTTP, true), harness.ProcOptions{Args: args, Dir: dir})
	harness.Eventually(t, 60*time.Second, fmt.Sprintf("%d records pending in the publisher's outbox", crashEvents), func() bool {
		m := pendingLine.FindAllStringSubmatch(first.Log(), -1)
		return len(m) > 0 && m[len(m)-1][1] == fmt.Sprint(crashEvents)
	})
	written := tracingIDs(first.Log())
	if len(written) != crashEvents {
		t.Fatalf("the publisher logged %d events, want %d", len(written), crashEvents)
	}
	first.Kill()

	consumer := harness.RunPipeline(t, consumerYAML(c, cloud.URL(), jaeger.OTLPHTTP), harness.ProcOptions{Args: args})
	bridge := harness.RunPipeline(t, bridgeYAML(c, edge.URL(), cloud.URL(), jaeger.OTLPGRPC), harness.ProcOptions{Args: args})
	harness.Eventually(t, 60*time.Second, "consumer and bridge subscribed", func() bool {
		return strings.Count(consumer.Log()+bridge.Log(), "is now active") >= 2
	})
	watch := harness.Subscribe(t, edge.URL(), "frame-watch", true, "reliable/ingress")
	harness.RunPipeline(t, crashPublisherYAML(c, edge.URL(), jaeger.OTLPHTTP, false), harness.ProcOptions{Args: args, Dir: dir})
	harness.Eventually(t, 120*time.Second, fmt.Sprintf("%d events at the consumer", crashEvents), func() bool {
		return len(tracingIDs(consumer.Log())) >= crashEvents
	})
	frames := watch.Frames()
	if c.pack != (frames > 0) {
		t.Fatalf("after the restart %d of %d publishes were frames, with pack %v", frames, watch.Count(), c.pack)
	}

	// Benthos's tracing_id() at the consumer is the trace of the write
	// before the crash.
	applied := tracingIDs(consumer.Log())
	for id, trace := range written {
		if applied[id] != trace {
			t.Errorf("%s: written in trace %s before the crash, applied in trace %q after it", id, trace, applied[id])
		}
	}

	// And in Jaeger: each event's bridge and consumer receive spans are in
	// that one trace.
	var report []string
	harness.PollProgress(30*time.Second, 120*time.Second, func() (int, bool) {
		traces, err := jaeger.Traces("consumer", 100)
		if err != nil {
			report = []string{err.Error()}
			return 0, false
		}
		byEvent := collect(traces)
		report = report[:0]
		for id, trace := range written {
			hs := byEvent[id]
			switch {
			case len(hs) != 1:
				report = append(report, fmt.Sprintf("%s: in %d traces", id, len(hs)))
			case hs[0].trace != trace:
				report = append(report, fmt.Sprintf("%s: in trace %s, written in %s", id, hs[0].trace, trace))
			case hs[0].bridgeRecv == nil || hs[0].bridgeOut == nil || hs[0].consRecv == nil:
				report = append(report, fmt.Sprintf("%s: trace %s lacks a bridge or consumer span", id, trace))
			case hs[0].consRecv.Parent() != hs[0].bridgeOut.SpanID:
				report = append(report, fmt.Sprintf("%s: the consumer's span is not a child of the bridge's", id))
			}
		}
		return crashEvents - len(report), len(report) == 0
	})
	if len(report) > 0 {
		t.Fatalf("events written before the crash are not in the trace of their write in Jaeger: %v", report)
	}
}
