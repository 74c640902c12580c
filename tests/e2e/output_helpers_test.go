package e2e

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// outWait bounds every "eventually delivered / drained" wait in the output
// suites: generous for a shared 2-core machine, still finite.
const outWait = 60 * time.Second

// outStall and outLimit bound a wait for a stream of messages (accepted,
// delivered, drained), whose length is the machine's speed: it fails once
// nothing moved for outStall, or after outLimit in all.
const (
	outStall = 60 * time.Second
	outLimit = 10 * time.Minute
)

// outWaitAccepted waits until the current run of p has accepted all of
// 1..count, for as long as it keeps accepting.
func outWaitAccepted(t *testing.T, p *harness.Proc, count int) {
	t.Helper()
	all := outUpTo(count)
	if !harness.PollProgress(outStall, outLimit, func() (int, bool) {
		accepted := outAccepted(t, p.RunLog())
		return len(accepted), len(outMissing(all, accepted)) == 0
	}) {
		t.Fatalf("the current run has not accepted %v (first 20) and accepted nothing for %s", outMissing(all, outAccepted(t, p.RunLog())), outStall)
	}
}

// outPublisher describes a reliable-mqtt pipeline that generates {"n":1} ..
// {"n":count} (one every millisecond) into reliable_mqtt_out.
//
// The output is the first of a fan_out_sequential broker whose second output
// prints "ACCEPTED <n>" to stdout. fan_out_sequential hands a message to the
// second output only after the first one's Write returned nil, so every
// ACCEPTED line is proof that reliable_mqtt_out accepted that message —
// exactly the messages that must never be lost. stdout goes straight to a
// file descriptor, so the line survives a SIGKILL that follows it.
//
// Generated messages beyond count are deleted instead of ending the input,
// so the process stays up and its sender can drain the outbox.
type outPublisher struct {
	url        string
	outboxPath string
	count      int
	topic      string
	window     int
	// batch is how many messages each 1ms tick generates (default 1).
	batch int
	// extra output fields, YAML lines without indentation ("confirm: end_to_end").
	extra []string
}

func (p outPublisher) yaml() string {
	batch := max(p.batch, 1)
	var extra strings.Builder
	for _, l := range p.extra {
		fmt.Fprintf(&extra, "          %s\n", l)
	}
	return fmt.Sprintf(`
logger:
  level: INFO
input:
  generate:
    interval: 1ms
    batch_size: %d
    count: 0
    mapping: |
      let n = counter()
      root = if $n > %d { deleted() } else { {"n": $n} }
pipeline:
  threads: 1
output:
  broker:
    pattern: fan_out_sequential
    outputs:
      - reliable_mqtt_out:
          urls: [ %q ]
          topic: %q
          event_id: 'evt-${! json("n") }'
          window: %d
          max_in_flight: 1
          outbox: { path: %q }
          stats_interval: 100ms
          publish_timeout: 1s
          ack_timeout: 2s
          keepalive: 5s
          reconnect_backoff: { initial_interval: 50ms, max_interval: 500ms }
          retry_backoff: { initial_interval: 50ms, max_interval: 500ms }
%s      - stdout:
          codec: lines
        processors:
          - mapping: 'root = "ACCEPTED " + this.n.string()'
`, batch, p.count, p.url, p.topic, p.window, p.outboxPath, extra.String())
}

// No "$": Benthos's stdout output writes a message and its newline in two
// writes, so a log line from another goroutine can land in between
// ("ACCEPTED 12time=...").
var outAcceptedLine = regexp.MustCompile(`(?m)^ACCEPTED (\d+)`)

// outAccepted returns the n of every ACCEPTED line in log.
func outAccepted(t *testing.T, log string) map[int]bool {
	t.Helper()
	out := map[int]bool{}
	for _, m := range outAcceptedLine.FindAllStringSubmatch(log, -1) {
		n, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatalf("bad ACCEPTED line %q", m[0])
		}
		out[n] = true
	}
	return out
}

var outPendingLine = regexp.MustCompile(`; (\d+) pending \(`)

// outLastPending is the pending count of the newest stats line in log, -1 if
// there is none yet.
func outLastPending(log string) int {
	m := outPendingLine.FindAllStringSubmatch(log, -1)
	if len(m) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// outN decodes {"n":<int>}.
func outN(t *testing.T, payload []byte) int {
	t.Helper()
	var v struct {
		N *int `json:"n"`
	}
	if err := json.Unmarshal(payload, &v); err != nil || v.N == nil {
		t.Fatalf("payload %q is not {\"n\":<int>}: %v", payload, err)
	}
	return *v.N
}

// outDelivery is one delivery envelope as the subscriber saw it.
type outDelivery struct {
	n       int
	eventID string
}

// outDeliveries decodes every message of s as a delivery envelope carrying
// {"n":<int>}, in arrival order, duplicates included.
func outDeliveries(t *testing.T, s *harness.Subscriber) []outDelivery {
	t.Helper()
	var out []outDelivery
	for _, m := range s.Messages() {
		out = append(out, outDeliveriesOf(t, m.Payload)...)
	}
	return out
}

// outDeliveriesOf decodes one publish: a delivery envelope, or a packed
// publisher's frame (its events in order).
func outDeliveriesOf(t *testing.T, payload []byte) []outDelivery {
	t.Helper()
	if frame.Is(payload) {
		_, events, err := frame.Decode(payload, frame.DefaultLimits)
		if err != nil {
			t.Fatalf("subscriber got a frame it cannot read: %v", err)
		}
		out := make([]outDelivery, 0, len(events))
		for _, e := range events {
			out = append(out, outDelivery{n: outN(t, e.Payload), eventID: e.ID})
		}
		return out
	}
	d, err := envelope.DecodeDelivery(payload)
	if err != nil {
		t.Fatalf("subscriber got something that is not a delivery envelope: %q: %v", payload, err)
	}
	return []outDelivery{{n: outN(t, d.Payload), eventID: d.EventID}}
}

// outDeliveredSet is the set of n in ds.
func outDeliveredSet(ds []outDelivery) map[int]bool {
	set := map[int]bool{}
	for _, d := range ds {
		set[d.n] = true
	}
	return set
}

// outInner extracts the generated {"n":..} from a stored record's
// publish payload.
type outInner func(stored []byte) ([]byte, error)

// outFromDelivery and outFromIngress unwrap the two envelopes the output stores.
func outFromDelivery(b []byte) ([]byte, error) {
	d, err := envelope.DecodeDelivery(b)
	return d.Payload, err
}

func outFromIngress(b []byte) ([]byte, error) {
	in, err := envelope.DecodeIngress(b)
	return in.Payload, err
}

// outOutboxContents opens the outbox file of a stopped process and returns
// the n of every pending record and the pending count from its stats.
func outOutboxContents(t *testing.T, path string, inner outInner) (ns map[int]bool, pending int) {
	t.Helper()
	ob, err := outbox.Open(path, outbox.Options{})
	if err != nil {
		t.Fatalf("open outbox %s of the stopped process: %v", path, err)
	}
	defer ob.Close()
	ns = map[int]bool{}
	var after uint64
	for {
		recs, err := ob.Read(after, 1000)
		if err != nil {
			t.Fatalf("read outbox %s: %v", path, err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			after = r.Seq
			payload, err := inner(r.Payload)
			if err != nil {
				t.Fatalf("outbox record %d (%s) is not the expected envelope: %v", r.Seq, r.EventID, err)
			}
			ns[outN(t, payload)] = true
		}
	}
	return ns, ob.Stats().Pending
}

// outMissing lists (sorted, at most 20) the members of want absent from have.
func outMissing(want map[int]bool, have ...map[int]bool) []int {
	var out []int
	for n := range want {
		found := false
		for _, h := range have {
			if h[n] {
				found = true
				break
			}
		}
		if !found {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	if len(out) > 20 {
		out = out[:20]
	}
	return out
}

// outUpTo is the set {1..n}.
func outUpTo(n int) map[int]bool {
	set := make(map[int]bool, n)
	for i := 1; i <= n; i++ {
		set[i] = true
	}
	return set
}

// outWaitDrained waits until the current run has accepted all of 1..count,
// every one has been delivered (per delivered(); nil skips that check) and
// a stats line printed after both reports 0 pending — an older line could
// predate the last appends. Then it stops the process gracefully and checks
// that the outbox file is empty.
func outWaitDrained(t *testing.T, p *harness.Proc, path string, inner outInner, count int, delivered func() map[int]bool) {
	t.Helper()
	all := outUpTo(count)
	outWaitAccepted(t, p, count)
	if delivered != nil && !harness.PollProgress(outStall, outLimit, func() (int, bool) {
		got := delivered()
		return len(got), len(outMissing(all, got)) == 0
	}) {
		t.Fatalf("still not delivered: %v (first 20), and nothing more for %s; the publisher's last stats line says %d pending",
			outMissing(all, delivered()), outStall, outLastPending(p.RunLog()))
	}
	from := len(p.RunLog())
	if !harness.PollProgress(outStall, outLimit, func() (int, bool) {
		log := p.RunLog()
		n := outLastPending(log[from:])
		return -n, len(log) > from && n == 0
	}) {
		t.Fatalf("the outbox did not drain: the last stats line says %d pending, no fewer for %s", outLastPending(p.RunLog()), outStall)
	}
	if err := p.Stop(15 * time.Second); err != nil {
		t.Fatalf("stopping the publisher: %v", err)
	}
	if ns, pending := outOutboxContents(t, path, inner); pending != 0 || len(ns) != 0 {
		t.Fatalf("outbox %s after the drain: %d pending (stats), records for n=%v; want empty", path, pending, outKeys(ns))
	}
}

func outKeys(set map[int]bool) []int {
	out := make([]int, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Ints(out)
	return out
}
