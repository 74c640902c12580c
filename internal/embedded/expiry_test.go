package embedded

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/reliable-mqtt/reliable-mqtt/internal/ledgerclock"
)

// These tests cannot step the host's wall clock (tests/powerloss steps a
// guest's), so they let it run past an expiry while the broker's observed
// (monotonic) clock, a fake here, stays behind: mochi's own checks, which
// compare with time.Now every second, would have deleted the session or
// the message by then.

// clockRig is a broker, restarted on its data directory at will, whose
// observed clock is fake.
type clockRig struct {
	t           *testing.T
	fake        *ledgerclock.Fake
	broker, url string // the listener's tcp:// and the broker's embedded://
	b           *Broker
}

func newClockRig(t *testing.T) *clockRig {
	addr := freeAddr(t)
	r := &clockRig{t: t, fake: ledgerclock.NewFake(ledgerclock.Today), broker: "tcp://" + addr,
		url: "embedded://?dir=" + url.QueryEscape(t.TempDir()) + "&listen=" + addr}
	r.start()
	return r
}

func (r *clockRig) start() {
	r.t.Helper()
	mono := &monoClock{now: r.fake.Source().Mono}
	b, err := Acquire(r.url, func(c *Config) { c.mono = mono })
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = b.Release() })
	r.b = b
}

func (r *clockRig) restart() {
	r.t.Helper()
	if err := r.b.Release(); err != nil {
		r.t.Fatal(err)
	}
	r.start()
}

// letWallClockPass sleeps past d and the expiry ticks that follow.
func letWallClockPass(d time.Duration) { time.Sleep(d + 3*expiryTick) }

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", waitFor, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func publishExpiring(t *testing.T, c *paho.Client, topic string, retain bool, payload string, expiry uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	var props *paho.PublishProperties
	if expiry > 0 {
		props = &paho.PublishProperties{MessageExpiry: &expiry}
	}
	if _, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Retain: retain, Payload: []byte(payload), Properties: props}); err != nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
}

// An MQTT 5 session with a 2 s expiry interval and 3 messages queued
// outlives 2 s of wall clock while 1 s of observed time passed, before
// and after a restart (which stores the interval asked for), and goes,
// with its subscription and its stored record, 2 s of observed time after
// its disconnect.
func TestSessionExpiryCountsObservedTimeNotTheWallClock(t *testing.T) {
	const interval = 2
	r := newClockRig(t)
	broker, fake := r.broker, r.fake
	present := func() bool { _, ok := r.b.inst.server.Clients.Get("s"); return ok }

	sub, _ := v5Session(t, broker, "s", true, interval, nil)
	v5Subscribe(t, sub, "exp/q", 1)
	_ = sub.Disconnect(&paho.Disconnect{})
	pub, _ := v5Client(t, broker, "pub", true, nil)
	for i := range 3 {
		v5Publish(t, pub, "exp/q", 1, false, i)
	}
	_ = pub.Disconnect(&paho.Disconnect{})

	letWallClockPass(interval * time.Second)
	fake.Pass(time.Second)
	letWallClockPass(0)
	if !present() {
		t.Fatal("the session was deleted after 1 s of observed time (interval 2 s)")
	}
	got := make(chan v5Received, 3)
	sub, ok := v5Session(t, broker, "s", false, interval, got)
	if !ok {
		t.Fatal("session present = false after 1 s of observed time")
	}
	receiveV5(t, got, "exp/q", 3, false)
	waitAcked(t, r.b, "s")
	_ = sub.Disconnect(&paho.Disconnect{})

	r.restart() // the session is disconnected from here on
	letWallClockPass(interval * time.Second)
	if !present() {
		t.Fatal("the restored session was deleted with no observed time since the restart")
	}
	fake.Pass(interval * time.Second)
	waitUntil(t, "the session deleted after its interval of observed time", func() bool { return !present() })
	if subs := r.b.inst.server.Topics.Subscribers("exp/q"); len(subs.Subscriptions) != 0 {
		t.Fatalf("subscriptions of the expired session remain: %v", subs.Subscriptions)
	}

	r.restart()
	if _, ok := v5Session(t, broker, "s", false, interval, nil); ok {
		t.Fatal("session present = true after it expired: its record stayed in the store")
	}
}

// A DISCONNECT that sets a new session expiry interval (60 s to 2 s) is
// stored with the session: after a restart it goes 2 s of observed time
// after the start.
func TestDisconnectIntervalIsKeptAcrossARestart(t *testing.T) {
	r := newClockRig(t)
	c, _ := v5Session(t, r.broker, "d", true, 60, nil)
	v5Subscribe(t, c, "exp/d", 1)
	two := uint32(2)
	if err := c.Disconnect(&paho.Disconnect{Properties: &paho.DisconnectProperties{SessionExpiryInterval: &two}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the broker sees the disconnect", func() bool {
		cl, ok := r.b.inst.server.Clients.Get("d")
		return ok && cl.Closed()
	})
	r.restart()
	letWallClockPass(0)
	r.fake.Pass(2 * time.Second)
	waitUntil(t, "the session deleted 2 s of observed time after the restart", func() bool {
		_, ok := r.b.inst.server.Clients.Get("d")
		return !ok
	})
}

// A will with a 2 s delay is not sent after 2 s of wall clock while no
// observed time passed; after 2 s of observed time it is, unless its
// session was resumed first.
func TestWillDelayCountsObservedTime(t *testing.T) {
	r := newClockRig(t)
	wills := make(chan v5Received, 2)
	obs, _ := v5Client(t, r.broker, "observer", true, wills)
	v5Subscribe(t, obs, "exp/will/#", 1)
	cut := func(id string) net.Conn {
		t.Helper()
		u, _ := url.Parse(r.broker)
		nc, err := net.DialTimeout("tcp", u.Host, waitFor)
		if err != nil {
			t.Fatal(err)
		}
		c := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: nc})
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		expiry, delay := uint32(60), uint32(2)
		if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30,
			Properties:     &paho.ConnectProperties{SessionExpiryInterval: &expiry},
			WillMessage:    &paho.WillMessage{Topic: "exp/will/" + id, QoS: 1, Payload: []byte(id + " gone")},
			WillProperties: &paho.WillProperties{WillDelayInterval: &delay}}); err != nil {
			t.Fatal(err)
		}
		return nc
	}
	_ = cut("a").Close() // the connection dies: its will is due in 2 s
	_ = cut("b").Close()
	waitUntil(t, "the broker sees both connections end", func() bool {
		a, aok := r.b.inst.server.Clients.Get("a")
		b, bok := r.b.inst.server.Clients.Get("b")
		return aok && bok && a.Closed() && b.Closed()
	})
	v5Session(t, r.broker, "b", false, 60, nil) // b comes back: its will is off

	letWallClockPass(2 * time.Second)
	select {
	case m := <-wills:
		t.Fatalf("%q sent after 2 s of wall clock and no observed time", m.payload)
	default:
	}
	r.fake.Pass(2 * time.Second)
	select {
	case m := <-wills:
		if string(m.payload) != "a gone" {
			t.Fatalf("will %q sent, want a's", m.payload)
		}
	case <-time.After(waitFor):
		t.Fatal("a's will not sent after its delay of observed time")
	}
	letWallClockPass(0)
	select {
	case m := <-wills:
		t.Fatalf("%q sent, though its session was resumed within the delay", m.payload)
	default:
	}
}

// A queued message and a retained one, each with a 3 s expiry, outlive
// 3 s of wall clock while 1 s of observed time passed, and arrive with
// 2 s left; a queued one goes after 3 s of observed time, from the store
// too, and so does the retained one. One read back from the store at a
// restart goes 3 s of observed time after it.
func TestMessageExpiryCountsObservedTimeNotTheWallClock(t *testing.T) {
	const expiry = 3
	r := newClockRig(t)
	broker, fake := r.broker, r.fake

	sub, _ := v5Client(t, broker, "m", false, nil)
	v5Subscribe(t, sub, "exp/m", 1)
	_ = sub.Disconnect(&paho.Disconnect{})
	pub, _ := v5Client(t, broker, "pub", true, nil)
	publishExpiring(t, pub, "exp/m", false, "A", expiry)
	publishExpiring(t, pub, "exp/r", true, "R", expiry)

	letWallClockPass(expiry * time.Second)
	fake.Pass(time.Second)
	letWallClockPass(0)
	left := func(what string, got <-chan v5Received, payload string) {
		t.Helper()
		select {
		case m := <-got:
			if string(m.payload) != payload || m.props == nil || m.props.MessageExpiry == nil || *m.props.MessageExpiry != expiry-1 {
				t.Fatalf("%s: got %q with properties %+v, want %q with %d s of expiry left", what, m.payload, m.props, payload, expiry-1)
			}
		case <-time.After(waitFor):
			t.Fatalf("%s: %s not received after 1 s of observed time (expiry %d s)", what, payload, expiry)
		}
	}
	got := make(chan v5Received, 2)
	sub, _ = v5Client(t, broker, "m", false, got)
	left("queued", got, "A")
	ret := make(chan v5Received, 1)
	late, _ := v5Client(t, broker, "late", true, ret)
	v5Subscribe(t, late, "exp/r", 1)
	left("retained", ret, "R")
	waitAcked(t, r.b, "m")
	_ = sub.Disconnect(&paho.Disconnect{})

	publishExpiring(t, pub, "exp/m", false, "B", expiry)
	fake.Pass(expiry * time.Second)
	waitUntil(t, "the queued message and the retained one deleted after their expiry of observed time", func() bool {
		cl, ok := r.b.inst.server.Clients.Get("m")
		_, retained := r.b.inst.server.Topics.Retained.GetAll()["exp/r"]
		return ok && cl.State.Inflight.Len() == 0 && !retained
	})

	// After a restart B stays deleted, and D, queued before it, gets its
	// whole interval of observed time again from the start.
	publishExpiring(t, pub, "exp/m", false, "D", expiry)
	r.restart()
	queued := func() int {
		cl, ok := r.b.inst.server.Clients.Get("m")
		if !ok {
			t.Fatal("the session of m is gone after the restart")
		}
		return cl.State.Inflight.Len()
	}
	if n := queued(); n != 1 {
		t.Fatalf("%d messages queued for m after the restart, want D alone", n)
	}
	fake.Pass(expiry*time.Second - time.Second)
	letWallClockPass(0)
	if queued() != 1 {
		t.Fatalf("D, restored, expired %d s after the start (expiry %d s)", expiry-1, expiry)
	}
	fake.Pass(time.Second)
	waitUntil(t, "D deleted its expiry of observed time after the start", func() bool { return queued() == 0 })

	// Then C, published now, is the first message m gets.
	pub, _ = v5Client(t, broker, "pub", true, nil)
	publishExpiring(t, pub, "exp/m", false, "C", 0)
	_, _ = v5Client(t, broker, "m", false, got)
	select {
	case m := <-got:
		if string(m.payload) != "C" {
			t.Fatalf("after the restart %q came first, want C: an expired message stayed in the store", m.payload)
		}
	case <-time.After(waitFor):
		t.Fatal("C not received after the restart")
	}
	if _, retained := r.b.inst.server.Topics.Retained.GetAll()["exp/r"]; retained {
		t.Fatal("the expired retained message came back after the restart")
	}
}
