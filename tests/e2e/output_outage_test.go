package e2e

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// outageCount messages at ~1 per ms keep the stream going for several
// seconds, long enough to put an outage in the middle of it.
const outageCount = 8000

// outOutage is what outOutageRun does in the middle of the stream: down,
// hold for a while, up. what names the outage in the failure message
// ("the broker was down").
type outOutage struct {
	what     string
	down, up func()
	hold     time.Duration
}

// outOutageRun starts a window-64 publisher towards url and a persistent
// subscriber on broker, waits until the stream is flowing, runs the outage
// (writes must go on meanwhile: store and forward), and then checks the
// recovery: every accepted message is delivered at least once without any
// help from the test, and the outbox drains. With pack the publisher packs
// up to 64 records a frame (the backlog an outage builds goes out in
// frames), and the subscriber must have received frames.
func outOutageRun(t *testing.T, broker *harness.Mosquitto, url, topic string, pack bool, o outOutage) *harness.Proc {
	t.Helper()
	// A persistent session, so that a broker restart does not cost the
	// subscriber what was queued for it.
	sub := harness.Subscribe(t, broker.URL(), "outage-sub-"+strings.ReplaceAll(topic, "/", "-"), false, topic)
	path := filepath.Join(t.TempDir(), "outbox.db")
	pub := outPublisher{url: url, outboxPath: path, count: outageCount, topic: topic, window: 64,
		extra: []string{"envelope: delivery"}}
	if pack {
		pub.extra = append(pub.extra, "pack: { max_events: 64 }")
	}
	p := harness.RunPipeline(t, pub.yaml(), harness.ProcOptions{})
	harness.Eventually(t, 30*time.Second, "the first deliveries", func() bool { return sub.Count() >= 100 })

	before := len(outAccepted(t, p.RunLog()))
	o.down()
	time.Sleep(o.hold)
	if len(outAccepted(t, p.RunLog())) == before {
		t.Fatalf("no write was accepted while %s: the outbox must store and forward", o.what)
	}
	o.up()

	accepted := outAccepted(t, p.RunLog())
	if len(accepted) >= outageCount {
		t.Fatalf("the stream ended before the outage was over (%d accepted): the test did not test an outage", len(accepted))
	}
	outWaitDrained(t, p, path, outFromDelivery, outageCount, func() map[int]bool { return outDeliveredSet(outDeliveries(t, sub)) })
	if lost := outMissing(outAccepted(t, p.Log()), outDeliveredSet(outDeliveries(t, sub))); len(lost) > 0 {
		t.Fatalf("accepted but never delivered: %v", lost)
	}
	ds := outDeliveries(t, sub)
	for i, d := range ds {
		if want := "evt-" + strconv.Itoa(d.n); d.eventID != want {
			t.Fatalf("delivery %d: n=%d arrived with event ID %q, want %q", i, d.n, d.eventID, want)
		}
	}
	t.Logf("%d deliveries for %d messages in %d publishes, %d of them frames", len(ds), outageCount, sub.Count(), sub.Frames())
	if pack && sub.Frames() == 0 {
		t.Fatal("the subscriber got no frame: the test did not test packing")
	}
	return p
}

// outPacking runs test unpacked and packed, as subtests.
func outPacking(t *testing.T, test func(t *testing.T, pack bool)) {
	for _, pack := range []bool{false, true} {
		t.Run(map[bool]string{false: "unpacked", true: "packed"}[pack], func(t *testing.T) { test(t, pack) })
	}
}

// TestOutputBrokerStoppedMidStreamLosesNothing stops mosquitto for 3 s in
// the middle of a stream: the publisher keeps accepting into its outbox,
// reconnects by itself when the broker is back, and delivers everything,
// unpacked and packed.
func TestOutputBrokerStoppedMidStreamLosesNothing(t *testing.T) {
	outPacking(t, func(t *testing.T, pack bool) {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{Persistence: true, MaxInflight: 1000})
		outOutageRun(t, m, m.URL(), "outage/stop", pack, outOutage{what: "the broker was down", down: m.Stop, up: m.Start, hold: 3 * time.Second})
	})
}

// TestOutputConnectionCutMidStreamLosesNothing closes the TCP connection
// (and refuses new ones) for 2 s, unpacked and packed.
func TestOutputConnectionCutMidStreamLosesNothing(t *testing.T) {
	outPacking(t, func(t *testing.T, pack bool) {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{MaxInflight: 1000})
		proxy := harness.NewProxy(t, m.Addr())
		p := outOutageRun(t, m, proxy.URL(), "outage/cut", pack, outOutage{what: "the connection was cut", down: proxy.Cut, up: proxy.Restore, hold: 2 * time.Second})
		if !strings.Contains(p.Log(), "resending from the oldest unconfirmed record") {
			t.Error("the publisher never logged a resend: the cut went unnoticed")
		}
	})
}

// TestOutputStalledConnectionLosesNothing black-holes the connection (open,
// but no byte moves) for longer than publish_timeout: the sender must
// notice through its own timeout, resend from the oldest unconfirmed
// record, and recover once bytes flow again; unpacked and packed.
func TestOutputStalledConnectionLosesNothing(t *testing.T) {
	outPacking(t, func(t *testing.T, pack bool) {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{MaxInflight: 1000})
		proxy := harness.NewProxy(t, m.Addr())
		p := outOutageRun(t, m, proxy.URL(), "outage/stall", pack, outOutage{what: "the connection was stalled", down: proxy.Stall, up: proxy.Restore,
			hold: 3 * time.Second}) // longer than publish_timeout (1s)
		if !noticed.MatchString(p.Log()) {
			t.Error("the publisher never logged a PUBACK timeout or a lost connection: the stall went unnoticed")
		}
	})
}

// noticed matches the publisher's log line for a PUBACK that did not come
// (for a record alone or a frame) or a lost connection.
var noticed = regexp.MustCompile(`no PUBACK for (event|frame) |connection lost`)
