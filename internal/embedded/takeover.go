package embedded

import (
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// Session takeover in mochi v2.7.9 (Server.attachClient and
// inheritClientSession) runs in this order for a CONNECT that resumes a
// stored session:
//
//	OnSessionEstablish(new) -> clone old inflight into new -> clear old
//	-> s.Clients.Add(new) -> CONNACK -> resend inflight -> OnSessionEstablished(new)
//
// A fan-out looks the subscriber up in s.Clients, so until Add it finds the
// old client: a QoS>0 message queued to it after the clone is cleared with
// it (or stays on the dead client) and is lost, although the publisher got
// its PUBACK. And a message queued to the new client between Add and the
// resend is written before, or in the middle of, the resent ones.
//
// fanoutGate closes both windows from outside mochi: every QoS>0 fan-out
// (OnPublish .. OnPublished) is a reader, every takeover of a stored session
// (OnSessionEstablish .. OnSessionEstablished) a writer. A takeover waits
// for the fan-outs already running, and new fan-outs wait for it to end.
// Invariant: while pending > 0 no fan-out starts, so between the clone and
// the end of the resend nothing is queued to either client of that ID.
//
// Every wait is bounded: a takeover that mochi abandons (the new connection
// fails before OnSessionEstablished, which mochi then never calls) ends
// when its connection closes or after takeoverLimit; a fan-out that never
// reaches OnPublished is released by OnDisconnect of its publisher.
type fanoutGate struct {
	mu      sync.Mutex
	active  int           // fan-outs between OnPublish and OnPublished
	pending int           // takeovers in progress
	closed  bool          // broker stopping: nobody waits any more
	changed chan struct{} // closed and replaced whenever active or pending drops
}

const (
	// takeoverLimit bounds how long one takeover holds fan-outs back, and
	// how long it waits for the fan-outs running when it began.
	takeoverLimit = 10 * time.Second
	// takeoverPoll is how often a takeover checks whether mochi abandoned it.
	takeoverPoll = 20 * time.Millisecond
)

func newFanoutGate() *fanoutGate { return &fanoutGate{changed: make(chan struct{})} }

func (g *fanoutGate) broadcastLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// enter starts a fan-out, waiting while a takeover is in progress. The
// wait is bounded because every takeover ends within takeoverLimit.
func (g *fanoutGate) enter() {
	g.mu.Lock()
	for g.pending > 0 && !g.closed {
		ch := g.changed
		g.mu.Unlock()
		<-ch
		g.mu.Lock()
	}
	g.active++
	g.mu.Unlock()
}

func (g *fanoutGate) leave() {
	g.mu.Lock()
	g.active--
	if g.active == 0 {
		g.broadcastLocked()
	}
	g.mu.Unlock()
}

// hold begins a takeover: new fan-outs wait from now on, and hold returns
// once the running ones have finished. It reports false if they did not
// finish within limit; the takeover is in progress either way and must be
// ended with release.
func (g *fanoutGate) hold(limit time.Duration) bool {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending++
	for g.active > 0 && !g.closed {
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			g.mu.Lock()
			return false
		}
		g.mu.Lock()
	}
	return true
}

func (g *fanoutGate) release() {
	g.mu.Lock()
	g.pending--
	if g.pending == 0 {
		g.broadcastLocked()
	}
	g.mu.Unlock()
}

func (g *fanoutGate) close() {
	g.mu.Lock()
	g.closed = true
	g.broadcastLocked()
	g.mu.Unlock()
}

// takeover is one CONNECT resuming a stored session, from
// OnSessionEstablish until its resend is done (or mochi gave it up).
type takeover struct {
	cl   *mqtt.Client // the new connection
	held bool         // it holds the gate; set before the watcher starts
	once sync.Once
	done chan struct{}
}

// beginTakeover runs in OnSessionEstablish. Takeovers of one client ID run
// one after the other, so a second CONNECT never clones a session that the
// first one is still moving.
func (h *storeHook) beginTakeover(cl *mqtt.Client) {
	var t *takeover
	deadline := time.Now().Add(takeoverLimit)
	for t == nil {
		h.mu.Lock()
		prev := h.takeovers[cl.ID]
		if prev == nil || time.Now().After(deadline) {
			t = &takeover{cl: cl, done: make(chan struct{})}
			h.takeovers[cl.ID] = t
		}
		h.mu.Unlock()
		if prev != nil && t == nil {
			select {
			case <-prev.done:
			case <-time.After(time.Until(deadline)):
			}
		}
	}
	// Only a stored session is moved; check after waiting for the previous
	// takeover, which may just have registered one.
	if _, ok := h.server.Clients.Get(cl.ID); !ok {
		h.endTakeover(t)
		return
	}
	t.held = true
	if !h.gate.hold(takeoverLimit) {
		h.Log.Warn("embedded broker: a publish did not finish within "+takeoverLimit.String()+
			" while a session was taken over; a message it fans out to this session may be lost",
			"client", cl.ID)
	}
	go h.watchTakeover(t)
}

// watchTakeover ends a takeover that mochi abandoned: the new connection
// failed before OnSessionEstablished (mochi calls no hook then), or the
// resend took longer than takeoverLimit.
func (h *storeHook) watchTakeover(t *takeover) {
	limit := time.NewTimer(takeoverLimit)
	defer limit.Stop()
	poll := time.NewTicker(takeoverPoll)
	defer poll.Stop()
	for {
		select {
		case <-t.done:
			return
		case <-poll.C:
			if t.cl.Closed() {
				h.endTakeover(t)
				return
			}
		case <-limit.C:
			h.Log.Warn("embedded broker: session takeover not finished within "+takeoverLimit.String()+
				"; publishing resumes, messages may reach this client out of order", "client", t.cl.ID)
			h.endTakeover(t)
			return
		}
	}
}

// finishTakeover ends cl's takeover, if it has one (OnSessionEstablished).
func (h *storeHook) finishTakeover(cl *mqtt.Client) {
	h.mu.Lock()
	t := h.takeovers[cl.ID]
	h.mu.Unlock()
	if t != nil && t.cl == cl {
		h.endTakeover(t)
	}
}

func (h *storeHook) endTakeover(t *takeover) {
	t.once.Do(func() {
		h.mu.Lock()
		if h.takeovers[t.cl.ID] == t {
			delete(h.takeovers, t.cl.ID)
		}
		h.mu.Unlock()
		if t.held {
			h.gate.release()
		}
		close(t.done)
	})
}
