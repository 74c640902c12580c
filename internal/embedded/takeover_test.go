package embedded

import (
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// TestSessionTakeoverLosesNoAcknowledgedMessage reconnects a persistent
// QoS 1 subscriber 100 times while a QoS 1 publisher publishes without
// pause (four of them). Every message the broker PUBACKed must reach the subscriber. Half
// the reconnects resume a session whose connection is closed, half take it
// over from a live connection. mochi alone loses messages queued to the
// old client while the new one inherits the session.
func TestSessionTakeoverLosesNoAcknowledgedMessage(t *testing.T) {
	b, err := Acquire("embedded://?dir=" + url.QueryEscape(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()

	got := newPayloadSet()
	newSub := func() paho.Client {
		c := connect(t, b.ClientURL(), "takeover-sub", false, got.handler)
		subscribe(t, c, "t/#", 1)
		return c
	}
	sub := newSub()

	// Several publishers, so that some publish is being fanned out
	// whenever a takeover happens.
	const publishers = 4
	stop := make(chan struct{})
	stopPublishers := sync.OnceFunc(func() { close(stop) })
	t.Cleanup(stopPublishers) // also when the test fails half-way
	done := make(chan []string, publishers)
	for p := range publishers {
		pub := connect(t, b.ClientURL(), fmt.Sprintf("takeover-pub-%d", p), true, nil)
		defer pub.Disconnect(100)
		go func() {
			var acked []string
			defer func() { done <- acked }()
			for i := 0; i < 200000; i++ { // bounded even if stop is never closed
				select {
				case <-stop:
					return
				default:
				}
				payload := fmt.Sprintf("p%d-%d", p, i)
				tok := pub.Publish("t/x", 1, false, payload)
				if tok.WaitTimeout(waitFor) && tok.Error() == nil {
					acked = append(acked, payload)
				}
			}
		}()
	}

	const reconnects = 100
	for i := range reconnects {
		time.Sleep(20 * time.Millisecond)
		old := sub
		if i%2 == 0 {
			old.Disconnect(50)
		}
		sub = newSub()
		if i%2 == 1 {
			old.Disconnect(0) // already taken over; just stop its goroutines
		}
	}
	stopPublishers()
	var acked []string
	for range publishers {
		acked = append(acked, <-done...)
	}
	defer sub.Disconnect(100)
	if len(acked) < reconnects {
		t.Fatalf("only %d publishes acknowledged; the test did not exercise takeovers", len(acked))
	}

	missing := got.waitFor(acked, waitFor)
	if len(missing) > 0 {
		t.Errorf("%d of %d acknowledged messages never reached the subscriber, e.g. %v",
			len(missing), len(acked), missing[:min(len(missing), 10)])
	}
	t.Logf("%d messages acknowledged across %d reconnects", len(acked), reconnects)
}

// TestResumedSessionResendsInPublishOrder queues 200 QoS 1 messages for an
// offline persistent session; when it resumes, live or after a broker
// restart, they must arrive in the order they were published
// (MQTT-4.6.0-1). mochi alone resends messages of the same second in
// arbitrary order.
func TestResumedSessionResendsInPublishOrder(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			u := "embedded://?dir=" + url.QueryEscape(t.TempDir())
			b, err := Acquire(u)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = b.Release() }()
			const n = 200
			const id = "ordered-sub"

			sub := connect(t, b.ClientURL(), id, false, nil)
			subscribe(t, sub, "o/#", 1)
			sub.Disconnect(100)

			pub := connect(t, b.ClientURL(), "ordered-pub", true, nil)
			for i := range n {
				publish(t, pub, "o/x", 1, false, fmt.Sprintf("m-%03d", i))
			}
			pub.Disconnect(100)

			if restart {
				b = restartBroker(t, b, u)
			}

			got := newCollector()
			sub, _ = connectSession(t, b.ClientURL(), id, false, got.handler)
			defer sub.Disconnect(100)
			got.waitCount(t, n)
			got.assertExactly(t, "o/x", n)
			assertInOrder(t, got, n)
		})
	}
}

// TestResendOrderSurvivesRepeatedTakeovers resumes a session twice without
// acknowledging anything in between: the second resend must keep the
// order as well, and a message published after the takeovers comes last.
func TestResendOrderSurvivesRepeatedTakeovers(t *testing.T) {
	b, err := Acquire("embedded://?dir=" + url.QueryEscape(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	const n = 100
	const id = "retaken-sub"
	sub := connect(t, b.ClientURL(), id, false, nil)
	subscribe(t, sub, "r/#", 1)
	sub.Disconnect(100)
	pub := connect(t, b.ClientURL(), "retaken-pub", true, nil)
	defer pub.Disconnect(100)
	for i := range n {
		publish(t, pub, "r/x", 1, false, fmt.Sprintf("m-%03d", i))
	}

	// A client that never acknowledges: the resend stays inflight.
	first := newCollector()
	opts := paho.NewClientOptions().AddBroker(b.ClientURL()).SetClientID(id).SetCleanSession(false).
		SetAutoReconnect(false).SetAutoAckDisabled(true).SetDefaultPublishHandler(first.handler)
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	first.waitCount(t, n)
	assertInOrder(t, first, n)
	c.Disconnect(50)

	got := newCollector()
	sub, _ = connectSession(t, b.ClientURL(), id, false, got.handler)
	defer sub.Disconnect(100)
	publish(t, pub, "r/x", 1, false, fmt.Sprintf("m-%03d", n))
	got.waitCount(t, n+1)
	got.assertExactly(t, "r/x", n+1)
	assertInOrder(t, got, n+1)
}

// assertInOrder checks that the first n messages are m-000 .. m-(n-1) in order.
func assertInOrder(t *testing.T, c *collector, n int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var order []string
	for i, m := range c.msgs[:n] {
		if want := fmt.Sprintf("m-%03d", i); string(m.payload) != want {
			for _, m := range c.msgs[:n] {
				order = append(order, strings.TrimPrefix(string(m.payload), "m-"))
			}
			t.Fatalf("message %d is %s, want %s; received order: %s", i, m.payload, want, strings.Join(order, " "))
		}
	}
}

// payloadSet records which payloads arrived, duplicates allowed.
type payloadSet struct {
	mu   sync.Mutex
	seen map[string]bool
}

func newPayloadSet() *payloadSet { return &payloadSet{seen: map[string]bool{}} }

func (s *payloadSet) handler(_ paho.Client, m paho.Message) {
	s.mu.Lock()
	s.seen[string(m.Payload())] = true
	s.mu.Unlock()
}

// waitFor waits until every payload in want arrived or the timeout passed,
// and returns the ones still missing.
func (s *payloadSet) waitFor(want []string, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	for {
		var missing []string
		s.mu.Lock()
		for _, p := range want {
			if !s.seen[p] {
				missing = append(missing, p)
			}
		}
		s.mu.Unlock()
		if len(missing) == 0 || time.Now().After(deadline) {
			return missing
		}
		time.Sleep(50 * time.Millisecond)
	}
}
