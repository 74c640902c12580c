package embedded

// Session and message expiry on observed time.
//
// mochi v2.7.9 measures both on the wall clock: its event loop calls
// clearExpiredClients, clearExpiredInflights and clearExpiredRetainedMessages
// with time.Now().Unix() every second, against a disconnected client's
// StopTime and a message's Expiry, both wall-clock seconds. A gateway's
// clock stepped forward by a year would end, at the next tick, every MQTT 5
// session with a finite session expiry interval, with the messages queued
// for it, and every message carrying an expiry.
//
// expiryHook takes both over, through mochi's hooks and public state, and
// measures them on the process's monotonic clock, which no step moves:
//
//   - Sessions: an MQTT 5 session expiry interval I with 0 < I < 2^32-1 is
//     kept here (and in the store), and mochi is shown 2^32-1 in its place,
//     the value MQTT 3 sessions get from MaximumSessionExpiryInterval: mochi
//     would then end the session only once the wall clock passed its
//     disconnect by 136 years. Once a session has been disconnected for I
//     of observed time the hook deletes it as mochi would (store, client
//     list, queued messages) and also drops its subscriptions, which mochi
//     leaves in its topic index.
//   - Messages: a publish with a message expiry interval E gets as Expiry
//     monoEpoch plus its deadline (monotonic milliseconds, now + E). mochi
//     compares Expiry with Unix seconds, which never reach monoEpoch, so it
//     expires none of them; the hook drops each queued copy and retained
//     copy past its deadline, and writes what is left of E into every
//     PUBLISH it sends.
//
//   - Wills: a will with a Will Delay Interval D is taken over as mochi
//     sends it (mochi is shown the longest delay) and published by the hook
//     after D of observed time, unless the session is resumed first.
//
// Time while no broker runs does not count: a session restored at start is
// disconnected from then on (as mochi restores it), and a message restored
// gets its whole interval again from then on (mochi's storage.Message has
// no field for an expiry time).

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/reliable-mqtt/reliable-mqtt/internal/ledgerclock"
	"github.com/reliable-mqtt/reliable-mqtt/internal/periodic"
)

const (
	// neverExpires is the MQTT 5 session expiry interval of a session
	// that does not expire, and what mochi is shown for every session.
	neverExpires = math.MaxUint32

	// monoEpoch marks an Expiry holding a monotonic deadline: Unix seconds
	// never reach it, and it leaves room for any deadline in milliseconds.
	monoEpoch int64 = 1 << 62

	// expiryTick is how often expired sessions and messages are deleted
	// (mochi's own period).
	expiryTick = time.Second
)

// finite reports whether a session expiry interval ends a session some
// time after its disconnect (0 ends it at once, neverExpires never).
func finite(interval uint32) bool { return interval > 0 && interval < neverExpires }

// delayedWill is a will whose delay the hook times.
type delayedWill struct {
	cl   *mqtt.Client
	will mqtt.Will
	at   time.Duration // monotonic time it is due
}

// offline is a disconnected session with a finite expiry interval.
type offline struct {
	cl *mqtt.Client  // the client mochi keeps for it
	at time.Duration // monotonic time of the first tick that found it closed
}

type expiryHook struct {
	mqtt.HookBase
	server *mqtt.Server
	store  *storeHook
	mono   func() time.Duration

	// sessionMu orders deleting an expired session against a CONNECT
	// that would resume it (OnSessionEstablish): the CONNECT either comes
	// first and the session is no longer expired, or after and finds none.
	sessionMu sync.Mutex

	mu         sync.Mutex              // guards the maps
	intervals  map[string]uint32       // client ID -> the finite session expiry interval it asked for
	gone       map[string]offline      // client ID -> its session, disconnected (expire's own)
	connecting map[string]*mqtt.Client // client ID -> its latest CONNECT, until that connection ends
	wills      map[string]delayedWill  // client ID -> its will, delayed

	// expiring is set once a message with an expiry interval has passed:
	// until then no queue needs the scan (mochi already sorts every
	// client's queue each second for its own).
	expiring atomic.Bool

	done    chan struct{}
	stopped chan struct{}
}

// newExpiryHook returns the hook for server, whose sessions store deletes;
// clock nil is the process's monotonic clock.
func newExpiryHook(server *mqtt.Server, store *storeHook, clock *monoClock) *expiryHook {
	mono := ledgerclock.System().Mono
	if clock != nil {
		mono = clock.now
	}
	return &expiryHook{server: server, store: store, mono: mono,
		intervals: map[string]uint32{}, gone: map[string]offline{}, connecting: map[string]*mqtt.Client{},
		wills: map[string]delayedWill{}}
}

func (h *expiryHook) ID() string { return "reliable-mqtt-expiry" }

func (h *expiryHook) Provides(b byte) bool {
	switch b {
	case mqtt.OnSessionEstablish, mqtt.OnDisconnect, mqtt.OnPacketRead, mqtt.OnPublish, mqtt.OnPacketEncode, mqtt.OnWill:
		return true
	}
	return false
}

func (h *expiryHook) Init(any) error {
	h.done, h.stopped = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(h.stopped)
		periodic.Run(h.done, expiryTick, h.expire)
	}()
	return nil
}

func (h *expiryHook) Stop() error {
	if h.done != nil {
		close(h.done)
		<-h.stopped
		h.done = nil
	}
	return nil
}

// OnSessionEstablish runs before mochi looks for a session to resume (and
// before the client is in its list): a session being resumed is no longer
// disconnected, and mochi sees neverExpires.
func (h *expiryHook) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	h.sessionMu.Lock()
	defer h.sessionMu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.gone, cl.ID)
	delete(h.wills, cl.ID) // [MQTT-3.1.3-9]: a resumed session's will is not sent
	h.connecting[cl.ID] = cl
	p := &cl.Properties.Props
	if cl.Properties.ProtocolVersion == 5 && finite(p.SessionExpiryInterval) {
		h.intervals[cl.ID] = p.SessionExpiryInterval
		p.SessionExpiryInterval = neverExpires
	} else {
		delete(h.intervals, cl.ID)
	}
}

// OnPacketRead takes a new interval from a DISCONNECT before mochi reads
// it, and stores it with the session. Its 0 stays 0: the session ends with
// the connection.
func (h *expiryHook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	v := pk.Properties.SessionExpiryInterval
	if pk.FixedHeader.Type != packets.Disconnect || !pk.Properties.SessionExpiryIntervalFlag || v == 0 ||
		cl.Properties.Props.SessionExpiryInterval == 0 { // mochi refuses a change from 0
		return pk, nil
	}
	h.mu.Lock()
	if finite(v) {
		h.intervals[cl.ID] = v
		pk.Properties.SessionExpiryInterval = neverExpires
	} else {
		delete(h.intervals, cl.ID)
	}
	h.mu.Unlock()
	h.store.w.enqueue(h.store.clientRecord(cl)) // with the interval asked for
	return pk, nil
}

// OnDisconnect forgets the interval of a session that ends with its
// connection, unless a newer CONNECT of the ID is under way (an old
// connection may report its end after the new one's OnSessionEstablish).
func (h *expiryHook) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.connecting[cl.ID]; c != nil && c != cl {
		return
	}
	delete(h.connecting, cl.ID)
	if expire {
		delete(h.intervals, cl.ID)
	}
}

// OnWill takes over a will with a delay: mochi would time it on the wall
// clock, so it is shown the longest delay and expire publishes the will.
func (h *expiryHook) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	if d := cl.Properties.Will.WillDelayInterval; d > 0 && d < neverExpires {
		h.mu.Lock()
		h.wills[cl.ID] = delayedWill{cl: cl, will: will, at: h.mono() + time.Duration(d)*time.Second}
		h.mu.Unlock()
		cl.Properties.Will.WillDelayInterval = neverExpires
	}
	return will, nil
}

// sendWills publishes the wills that are due, as mochi's sendDelayedLWT
// would, through the inline client. sessionMu keeps a CONNECT that
// resumes one of the sessions from coming in between.
func (h *expiryHook) sendWills(now time.Duration) {
	h.mu.Lock()
	none := len(h.wills) == 0
	h.mu.Unlock()
	if none {
		return
	}
	h.sessionMu.Lock()
	defer h.sessionMu.Unlock()
	h.mu.Lock()
	var due []delayedWill
	for id, w := range h.wills {
		if w.at <= now {
			due = append(due, w)
			delete(h.wills, id)
		}
	}
	h.mu.Unlock()
	inline, ok := h.server.Clients.Get(mqtt.InlineClientId)
	for _, w := range due {
		pk := packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: w.will.Qos, Retain: w.will.Retain},
			TopicName:   w.will.TopicName,
			Payload:     w.will.Payload,
			Properties:  packets.Properties{User: w.will.User},
			PacketID:    1, // mochi validates QoS>0 packets for a non-zero ID; inline publishes never use it
		}
		if !ok {
			h.Log.Error("embedded broker: inline client missing; a delayed will is not sent", "client", w.cl.ID)
			continue
		}
		if err := h.server.InjectPacket(inline, pk); err != nil {
			h.Log.Error("embedded broker: send a delayed will", "client", w.cl.ID, "error", err)
			continue
		}
		w.cl.Properties.Will = mqtt.Will{} // [MQTT-3.1.2-10]
		h.store.OnWillSent(w.cl, pk)
	}
}

// OnPublish replaces the wall-clock Expiry mochi just gave a publish with
// its monotonic deadline.
func (h *expiryHook) OnPublish(_ *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if e := pk.Properties.MessageExpiryInterval; e > 0 {
		pk.Expiry = h.deadline(e)
	}
	return pk, nil
}

// deadline is the Expiry of a message whose interval of e seconds starts now.
func (h *expiryHook) deadline(e uint32) int64 {
	h.expiring.Store(true)
	return monoEpoch + (h.mono() + time.Duration(e)*time.Second).Milliseconds()
}

// stampRestored gives each message mochi read back from the store, which
// kept no expiry time, its whole interval from now. It runs in
// StoredSysInfo: mochi calls that after loading every message and before
// its listeners accept a connection, so no client is acknowledging (and
// removing) a message that Set would then put back.
func (h *expiryHook) stampRestored() {
	for _, cl := range h.server.Clients.GetAll() {
		for _, pk := range cl.State.Inflight.GetAll(false) {
			if e := pk.Properties.MessageExpiryInterval; e > 0 && pk.Expiry == 0 {
				pk.Expiry = h.deadline(e)
				cl.State.Inflight.Set(pk)
			}
		}
	}
	for topic, pk := range h.server.Topics.Retained.GetAll() {
		if e := pk.Properties.MessageExpiryInterval; e > 0 && pk.Expiry == 0 {
			pk.Expiry = h.deadline(e)
			h.server.Topics.Retained.Add(topic, pk)
		}
	}
}

// OnPacketEncode writes what is left of a message's expiry interval (at
// least 1 s, as mochi does) into a PUBLISH about to be sent.
func (h *expiryHook) OnPacketEncode(_ *mqtt.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Publish && pk.Expiry >= monoEpoch {
		left := time.Duration(pk.Expiry-monoEpoch)*time.Millisecond - h.mono()
		pk.Properties.MessageExpiryInterval = uint32(max(1, (left+time.Second-1)/time.Second))
	}
	return pk
}

// expired reports whether a monotonic deadline in Expiry has come.
func expired(pk packets.Packet, now time.Duration) bool {
	return pk.Expiry >= monoEpoch && time.Duration(pk.Expiry-monoEpoch)*time.Millisecond <= now
}

// restored notes the intervals of the sessions read from the store, and
// shows mochi neverExpires in their place.
func (h *expiryHook) restored(clients []storage.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range clients {
		c := &clients[i]
		if c.ProtocolVersion == 5 && finite(c.Properties.SessionExpiryInterval) {
			h.intervals[c.ID] = c.Properties.SessionExpiryInterval
			c.Properties.SessionExpiryInterval = neverExpires
		}
	}
}

// asked is the session expiry interval to store for a client whose
// interval mochi sees as shown: the one the client asked for.
func (h *expiryHook) asked(id string, shown uint32) uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if v, ok := h.intervals[id]; ok {
		return v
	}
	return shown
}

// expire sends the wills that are due and deletes what has expired:
// sessions first, then queued and retained messages. A session is disconnected from the first tick that
// finds its client in mochi's list closed, whichever way it closed
// (mochi calls no hook for a connection that fails after taking a session
// over, and restores stored sessions closed), so each one ends within its
// interval plus a tick.
func (h *expiryHook) expire() {
	now := h.mono()
	h.sendWills(now) // before sessions: a will is due at the latest when its session ends
	clients := h.server.Clients.GetAll()
	var due []*mqtt.Client
	h.mu.Lock()
	for id, o := range h.gone {
		if clients[id] != o.cl {
			delete(h.gone, id) // resumed or deleted since
		}
	}
	for id, cl := range clients {
		interval, ok := h.intervals[id]
		o, seen := h.gone[id]
		switch {
		case !ok || !cl.Closed():
			delete(h.gone, id)
		case !seen:
			h.gone[id] = offline{cl: cl, at: now}
		case now-o.at >= time.Duration(interval)*time.Second:
			due = append(due, cl)
			delete(h.gone, id)
		}
	}
	h.mu.Unlock()
	for _, cl := range due {
		h.endSession(cl)
	}

	if !h.expiring.Load() {
		return
	}
	for _, cl := range clients {
		for _, pk := range cl.State.Inflight.GetAll(false) {
			if expired(pk, now) && cl.State.Inflight.Delete(pk.PacketID) {
				atomic.AddInt64(&h.server.Info.Inflight, -1)
				h.store.OnQosDropped(cl, pk)
			}
		}
	}
	for topic, pk := range h.server.Topics.Retained.GetAll() {
		if expired(pk, now) {
			h.server.Topics.Retained.Delete(topic)
			h.store.OnRetainedExpired(topic)
		}
	}
}

// endSession deletes an expired session, unless a CONNECT resumed it or
// is resuming it (its old connection may report its end late, after the
// new one's OnSessionEstablish). The fan-out gate is held so that no
// publish queues a message to it while it goes.
func (h *expiryHook) endSession(cl *mqtt.Client) {
	h.sessionMu.Lock()
	defer h.sessionMu.Unlock()
	h.mu.Lock()
	c := h.connecting[cl.ID]
	h.mu.Unlock()
	if c != nil && c != cl && !c.Closed() {
		return
	}
	if cur, ok := h.server.Clients.Get(cl.ID); !ok || cur != cl {
		return
	}
	if !h.store.gate.hold(takeoverLimit) {
		h.Log.Warn("embedded broker: a publish did not finish within "+takeoverLimit.String()+
			" while an expired session was deleted; a message it queues there stays in the store", "client", cl.ID)
	}
	defer h.store.gate.release()
	h.mu.Lock()
	interval := h.intervals[cl.ID]
	delete(h.intervals, cl.ID)
	h.mu.Unlock()
	h.Log.Info("embedded broker: session expired, its queued messages are dropped", "client", cl.ID,
		"session_expiry_interval", time.Duration(interval)*time.Second, "queued", cl.State.Inflight.Len())
	h.server.Clients.Delete(cl.ID)
	h.server.UnsubscribeClient(cl)
	cl.ClearInflights()
	h.store.OnClientExpired(cl)
}
