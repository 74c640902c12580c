package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// outageCount messages at ~1 per ms keep the stream going for several
// seconds, long enough to put an outage in the middle of it.
const outageCount = 8000

// outOutageRun starts a window-64 publisher towards url and a persistent
// subscriber on broker, waits until the stream is flowing, runs outage,
// and then checks the recovery: every accepted message is delivered at
// least once without any help from the test, and the outbox drains.
func outOutageRun(t *testing.T, broker *harness.Mosquitto, url, topic string, outage func(p *harness.Proc)) *harness.Proc {
	t.Helper()
	// A persistent session, so that a broker restart does not cost the
	// subscriber what was queued for it.
	sub := harness.Subscribe(t, broker.URL(), "outage-sub-"+strings.ReplaceAll(topic, "/", "-"), false, topic)
	path := filepath.Join(t.TempDir(), "outbox.db")
	pub := outPublisher{url: url, outboxPath: path, count: outageCount, topic: topic, window: 64,
		extra: []string{"envelope: delivery"}}
	p := harness.RunPipeline(t, pub.yaml(), harness.ProcOptions{})
	harness.Eventually(t, 30*time.Second, "the first deliveries", func() bool { return sub.Count() >= 100 })

	outage(p)

	accepted := outAccepted(t, p.RunLog())
	if len(accepted) >= outageCount {
		t.Fatalf("the stream ended before the outage was over (%d accepted): the test did not test an outage", len(accepted))
	}
	outWaitDrained(t, p, path, outFromDelivery, outageCount, func() map[int]bool { return outDeliveredSet(outDeliveries(t, sub)) })
	if lost := outMissing(outAccepted(t, p.Log()), outDeliveredSet(outDeliveries(t, sub))); len(lost) > 0 {
		t.Fatalf("accepted but never delivered: %v", lost)
	}
	t.Logf("%d deliveries for %d messages", sub.Count(), outageCount)
	return p
}

// outAcceptedDuring reports how many messages the publisher accepted while fn
// ran: writes must go on while the broker is unreachable (store and forward).
func outAcceptedDuring(t *testing.T, p *harness.Proc, fn func()) int {
	t.Helper()
	before := len(outAccepted(t, p.RunLog()))
	fn()
	return len(outAccepted(t, p.RunLog())) - before
}

// TestOutputBrokerStoppedMidStreamLosesNothing stops mosquitto for 3 s in
// the middle of a stream: the publisher keeps accepting into its outbox,
// reconnects by itself when the broker is back, and delivers everything.
func TestOutputBrokerStoppedMidStreamLosesNothing(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{Persistence: true, MaxInflight: 1000})
	outOutageRun(t, m, m.URL(), "outage/stop", func(p *harness.Proc) {
		n := outAcceptedDuring(t, p, func() {
			m.Stop()
			time.Sleep(3 * time.Second)
		})
		if n == 0 {
			t.Fatal("no write was accepted while the broker was down: the outbox must store and forward")
		}
		m.Start()
	})
}

// TestOutputConnectionCutMidStreamLosesNothing closes the TCP connection
// (and refuses new ones) for 2 s.
func TestOutputConnectionCutMidStreamLosesNothing(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{MaxInflight: 1000})
	proxy := harness.NewProxy(t, m.Addr())
	p := outOutageRun(t, m, proxy.URL(), "outage/cut", func(p *harness.Proc) {
		n := outAcceptedDuring(t, p, func() {
			proxy.Cut()
			time.Sleep(2 * time.Second)
		})
		if n == 0 {
			t.Fatal("no write was accepted while the connection was cut")
		}
		proxy.Restore()
	})
	if !strings.Contains(p.Log(), "resending from the oldest unconfirmed record") {
		t.Error("the publisher never logged a resend: the cut went unnoticed")
	}
}

// TestOutputStalledConnectionLosesNothing black-holes the connection (open,
// but no byte moves) for longer than publish_timeout: the sender must
// notice through its own timeout, resend from the oldest unconfirmed
// record, and recover once bytes flow again.
func TestOutputStalledConnectionLosesNothing(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{MaxInflight: 1000})
	proxy := harness.NewProxy(t, m.Addr())
	p := outOutageRun(t, m, proxy.URL(), "outage/stall", func(p *harness.Proc) {
		n := outAcceptedDuring(t, p, func() {
			proxy.Stall()
			time.Sleep(3 * time.Second) // publish_timeout is 1s
		})
		if n == 0 {
			t.Fatal("no write was accepted while the connection was stalled")
		}
		proxy.Restore()
	})
	if !strings.Contains(p.Log(), "no PUBACK for event") && !strings.Contains(p.Log(), "connection lost") {
		t.Error("the publisher never logged a PUBACK timeout or a lost connection: the stall went unnoticed")
	}
}
