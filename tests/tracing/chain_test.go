// Package tracing proves that one event is one trace across every hop of a
// publisher → bridge → consumer chain, in a real Jaeger: three processes of
// the real binary with the open_telemetry_collector tracer, on two
// mosquitto brokers, and Jaeger's own query API read back. The chain runs
// twice: on MQTT 5 (the trace context in user properties) and on MQTT
// 3.1.1 with trace_context: envelope (in the reliomq v1 envelopes).
package tracing

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

const (
	events     = 20 // ordinary events ev-01 … ev-20
	deadLetter = "ev-21"
	wantTraces = 18 // of events: "≥ 18 of 20" (a span may be dropped by a loaded exporter)
)

// chain is how the three processes speak MQTT, and so where the trace
// context travels.
type chain struct {
	protocol      string // protocol_version of every MQTT component
	traceEnvelope bool   // trace_context: envelope on the components whose envelopes carry it
	pack          bool   // the publisher packs what waits into frames (pack.max_events 64), generating every 2 ms
}

var (
	mqtt5         = chain{protocol: "5"}
	mqtt311Trace  = chain{protocol: "3.1.1", traceEnvelope: true}
	mqtt5Packed   = chain{protocol: "5", pack: true}
	mqtt311Packed = chain{protocol: "3.1.1", traceEnvelope: true, pack: true}
)

// settings are c's YAML lines for a component, indented by indent;
// enveloped says whether the component sends or reads reliomq v1 envelopes
// (only those take trace_context: envelope).
func (c chain) settings(indent string, enveloped bool) string {
	s := indent + `protocol_version: "` + c.protocol + `"` + "\n"
	if c.traceEnvelope && enveloped {
		s += indent + "trace_context: envelope\n"
	}
	return s
}

func tracer(service, transport, addr string) string {
	return fmt.Sprintf(`
tracer:
  open_telemetry_collector:
    service: %s
    %s: [ { address: "%s" } ]
`, service, transport, addr)
}

// The publisher writes ev-01 … ev-21 and then nothing (the process stays
// up, so the outbox drains); ev-21 is larger than the bridge's
// max_payload_bytes, so the bridge dead-letters it. Each side logs
// tracing_id() so the test can compare what Benthos reads at both ends.
func publisherYAML(c chain, broker, collector string) string {
	return publisherWith(c, broker, collector, `let seq = counter()
      meta event_id = "ev-%02d".format($seq)
      root = if $seq > 21 { deleted() } else { { "seq": $seq, "pad": if $seq == 21 { "%0800d".format(0) } else { "" } } }`)
}

// publisherWith is a publisher whose generate input runs mapping (indented
// for its place in the YAML) and whose output has the fields extra (each a
// "key: value" line) besides the chain's.
func publisherWith(c chain, broker, collector, mapping string, extra ...string) string {
	if c.pack {
		extra = append(extra, "pack: { max_events: 64 }")
	}
	more := ""
	for _, f := range extra {
		more += "    " + f + "\n"
	}
	interval := "50ms"
	if c.pack {
		interval = "2ms" // events wait together: frames
	}
	return `
input:
  generate:
    interval: ` + interval + `
    mapping: |
      ` + mapping + `
pipeline:
  processors:
    - log:
        level: INFO
        message: 'TRACED ${! meta("event_id") } ${! tracing_id() }'
output:
  reliable_mqtt_out:
    urls: [ "` + broker + `" ]
` + c.settings("    ", true) + `    client_id: publisher-1
    topic: factory/press-1/data
    event_id: ${! meta("event_id") }
    confirm: end_to_end
    data_topic: reliable/ingress
    ack_topic: reliable/acks
` + more + `    outbox:
      path: ./publisher-outbox.db
` + tracer("publisher", "http", collector)
}

func bridgeYAML(c chain, source, dest, collector string) string {
	return `
input:
  reliable_mqtt_in:
    urls: [ "` + source + `" ]
` + c.settings("    ", true) + `    client_id: bridge-1
    topics: [ reliable/ingress ]
    qos: 1
    envelope: ingress
    ack_topic: reliable/acks
output:
  fallback:
    - reliable_mqtt_out:
        urls: [ "` + dest + `" ]
` + c.settings("        ", true) + `        client_id: bridge-1-out
        topic: ${! meta("destination_topic") }
        event_id: ${! meta("event_id") }
        confirm: end_to_end
        data_topic: reliable/deliveries
        ack_topic: reliable/consumer-acks
        max_payload_bytes: 400
        outbox:
          enabled: false
    - switch:
        cases:
          - check: '@fallback_error.contains("permanent failure: ")'
            output:
              reliable_mqtt_out:
                urls: [ "` + dest + `" ]
` + c.settings("                ", false) + `                client_id: bridge-1-dead-letter
                topic: reliable/dead-letter
                event_id: ${! meta("event_id") }
                outbox:
                  enabled: false
          - output:
              reject: 'not forwarded: ${! meta("fallback_error") }'
` + tracer("bridge", "grpc", collector)
}

func consumerYAML(c chain, broker, collector string) string {
	return `
input:
  reliable_mqtt_in:
    urls: [ "` + broker + `" ]
` + c.settings("    ", true) + `    client_id: consumer-1
    topics: [ reliable/deliveries ]
    qos: 1
    envelope: ingress
    ack_topic: reliable/consumer-acks
pipeline:
  processors:
    - dedup_ledger:
        key: ${! meta("event_id") }
        path: ./ledger.db
    - log:
        level: INFO
        message: 'TRACED ${! meta("event_id") } ${! tracing_id() }'
output:
  drop: {}
` + tracer("consumer", "http", collector)
}

var tracedLine = regexp.MustCompile(`TRACED (ev-\d\d) ([0-9a-f]{32})`)

// tracingIDs reads the TRACED lines of a process's log: event → trace ID.
func tracingIDs(log string) map[string]string {
	ids := map[string]string{}
	for _, m := range tracedLine.FindAllStringSubmatch(log, -1) {
		ids[m[1]] = m[2]
	}
	return ids
}

// hopSpans are the spans of one event's trace that the test checks.
type hopSpans struct {
	trace                                       string
	pubDeliver, bridgeRecv, bridgeOut, consRecv *harness.JaegerSpan
	services                                    map[string]bool
	outcomes                                    []string
}

// collect indexes every trace Jaeger holds by the event IDs its spans name;
// an event named in two traces is recorded under both.
func collect(traces []harness.JaegerTrace) map[string][]hopSpans {
	byEvent := map[string][]hopSpans{}
	for _, tr := range traces {
		h := hopSpans{trace: tr.TraceID, services: map[string]bool{}}
		ids := map[string]bool{}
		for i := range tr.Spans {
			s := &tr.Spans[i]
			svc := tr.Processes[s.ProcessID].ServiceName
			h.services[svc] = true
			if id := s.Tag("event_id"); id != "" {
				ids[id] = true
			}
			if o := s.Tag("reliable_mqtt.outcome"); o != "" {
				h.outcomes = append(h.outcomes, svc+":"+o)
			}
			switch {
			case svc == "publisher" && strings.HasPrefix(s.OperationName, "deliver "):
				h.pubDeliver = s
			case svc == "bridge" && strings.HasPrefix(s.OperationName, "receive "):
				h.bridgeRecv = s
			case svc == "bridge" && strings.HasPrefix(s.OperationName, "deliver "):
				h.bridgeOut = s
			case svc == "consumer" && strings.HasPrefix(s.OperationName, "receive "):
				h.consRecv = s
			}
		}
		for id := range ids {
			byEvent[id] = append(byEvent[id], h)
		}
	}
	return byEvent
}

// causal reports why h is not one trace through all three services in
// causal order ("" when it is): each receive span is a child of the
// previous hop's deliver span and starts after it, and the publisher's
// span lasts until the consumer received the event (its ACK closes it).
func causal(h hopSpans) string {
	switch {
	case !h.services["publisher"] || !h.services["bridge"] || !h.services["consumer"]:
		return fmt.Sprintf("services %v", h.services)
	case h.pubDeliver == nil || h.bridgeRecv == nil || h.bridgeOut == nil || h.consRecv == nil:
		return "a hop's span is missing"
	case h.bridgeRecv.Parent() != h.pubDeliver.SpanID:
		return "the bridge's receive span is not a child of the publisher's deliver span"
	case h.consRecv.Parent() != h.bridgeOut.SpanID:
		return "the consumer's receive span is not a child of the bridge's deliver span"
	case h.pubDeliver.StartTime > h.bridgeRecv.StartTime || h.bridgeRecv.StartTime > h.bridgeOut.StartTime || h.bridgeOut.StartTime > h.consRecv.StartTime:
		return "spans start out of causal order"
	case h.pubDeliver.StartTime+h.pubDeliver.Duration < h.consRecv.StartTime:
		return "the publisher's span ended before the consumer received the event"
	case h.pubDeliver.Tag("reliable_mqtt.outcome") != "confirmed":
		return "the publisher's span is not confirmed: " + h.pubDeliver.Tag("reliable_mqtt.outcome")
	}
	return ""
}

func TestEachEventIsOneTraceThroughPublisherBridgeAndConsumer(t *testing.T) {
	checkChain(t, mqtt5)
}

// On MQTT 3.1.1 there are no user properties: with trace_context: envelope
// on every enveloped component the context rides in the reliomq v1
// envelopes, and each event is still one trace through all three processes.
func TestEachEventIsOneTraceOverMQTT311WithTheTraceContextInTheEnvelope(t *testing.T) {
	checkChain(t, mqtt311Trace)
}

// When the publisher packs events into frames, the bridge unpacks them and
// each event is still one trace of its own through all three processes,
// on MQTT 5 and on 3.1.1 (the trace context inside the frame either way).
func TestEachEventIsOneTraceWhenThePublisherPacksFrames(t *testing.T) {
	for name, c := range map[string]chain{"MQTT 5": mqtt5Packed, "MQTT 3.1.1": mqtt311Packed} {
		t.Run(name, func(t *testing.T) { checkChain(t, c) })
	}
}

// checkChain runs the chain as c says and checks, in Jaeger, that ≥ 18 of
// 20 events are one causal trace through the three services, that
// tracing_id() reads that trace at both ends, and that the dead-lettered
// event's trace says so.
func checkChain(t *testing.T, c chain) {
	jaeger := harness.StartJaeger(t)
	edge := harness.StartMosquitto(t, harness.MosquittoOptions{})
	cloud := harness.StartMosquitto(t, harness.MosquittoOptions{})
	args := []string{"--log.level", "info", "-s", "http.enabled=false"}

	consumer := harness.RunPipeline(t, consumerYAML(c, cloud.URL(), jaeger.OTLPHTTP), harness.ProcOptions{Args: args})
	bridge := harness.RunPipeline(t, bridgeYAML(c, edge.URL(), cloud.URL(), jaeger.OTLPGRPC), harness.ProcOptions{Args: args})
	// The publisher starts once both subscribers are up, so nothing waits
	// on a session that does not exist yet.
	harness.Eventually(t, 60*time.Second, "consumer and bridge subscribed", func() bool {
		return strings.Count(consumer.Log()+bridge.Log(), "is now active") >= 2
	})
	watch := harness.Subscribe(t, edge.URL(), "frame-watch", true, "reliable/ingress")
	publisher := harness.RunPipeline(t, publisherYAML(c, edge.URL(), jaeger.OTLPHTTP), harness.ProcOptions{Args: args})

	// Every event applied at the consumer (logged with its tracing_id).
	harness.Eventually(t, 120*time.Second, "20 events at the consumer", func() bool {
		return len(tracingIDs(consumer.Log())) >= events
	})

	// The spans reach Jaeger while the processes run (the batch exporter
	// flushes every 2 s): the processes are not stopped before this.
	var byEvent map[string][]hopSpans
	complete := func() (n int) {
		for i := 1; i <= events; i++ {
			if hs := byEvent[fmt.Sprintf("ev-%02d", i)]; len(hs) == 1 && causal(hs[0]) == "" {
				n++
			}
		}
		return n
	}
	var lastErr error
	harness.PollProgress(30*time.Second, 120*time.Second, func() (int, bool) {
		traces, err := jaeger.Traces("consumer", 200)
		if err != nil {
			lastErr = err
			return 0, false
		}
		byEvent = collect(traces)
		if dl, err := jaeger.Traces("bridge", 200); err == nil {
			for id, hs := range collect(dl) {
				if id == deadLetter {
					byEvent[id] = hs
				}
			}
		}
		n := complete()
		return n, n == events && len(byEvent[deadLetter]) == 1 && len(byEvent[deadLetter][0].outcomes) > 0
	})
	if byEvent == nil {
		t.Fatalf("Jaeger's query API never answered: %v", lastErr)
	}

	frames := watch.Frames()
	if c.pack != (frames > 0) {
		t.Fatalf("%d of %d publishes on reliable/ingress were frames, with pack %v", frames, watch.Count(), c.pack)
	}
	t.Logf("%d of %d publishes on reliable/ingress were frames", frames, watch.Count())

	pubIDs, consIDs := tracingIDs(publisher.Log()), tracingIDs(consumer.Log())
	n := complete()
	var report []string
	for i := 1; i <= events; i++ {
		id := fmt.Sprintf("ev-%02d", i)
		hs := byEvent[id]
		switch {
		case len(hs) != 1:
			report = append(report, fmt.Sprintf("%s: in %d traces", id, len(hs)))
		case causal(hs[0]) != "":
			report = append(report, fmt.Sprintf("%s: trace %s: %s", id, hs[0].trace, causal(hs[0])))
		case pubIDs[id] != hs[0].trace || consIDs[id] != hs[0].trace:
			// tracing_id() must read the event's one trace at both ends.
			t.Errorf("%s: tracing_id() is %q at the publisher and %q at the consumer; Jaeger's trace is %s", id, pubIDs[id], consIDs[id], hs[0].trace)
		}
	}
	sort.Strings(report)
	t.Logf("%d of %d events are one trace through publisher, bridge and consumer in causal order; the rest: %v", n, events, report)
	if n < wantTraces {
		t.Fatalf("only %d of %d events form one causal trace across the three services (want ≥ %d): %v", n, events, wantTraces, report)
	}

	// The dead-lettered event's trace says so: the bridge's span for the
	// dead-letter output carries the outcome and the reason, and the
	// publisher's span is still confirmed (a dead letter is ACKed).
	dl := byEvent[deadLetter]
	if len(dl) != 1 {
		t.Fatalf("%s is in %d traces, want 1", deadLetter, len(dl))
	}
	got := strings.Join(dl[0].outcomes, ", ")
	if !strings.Contains(got, "bridge:dead-lettered") || !strings.Contains(got, "bridge:refused") {
		t.Errorf("%s's trace %s: outcomes %q, want the bridge's output refused and dead-lettered", deadLetter, dl[0].trace, got)
	}
	if !dl[0].services["publisher"] || dl[0].services["consumer"] {
		t.Errorf("%s's trace %s has services %v: want the publisher's and the bridge's, not the consumer's", deadLetter, dl[0].trace, dl[0].services)
	}
}
