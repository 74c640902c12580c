package mqttclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// MQTT 5 on the low-level paho.golang client (not autopaho: the Client's
// loop owns reconnects and sessions, as for 3.1.1). paho.golang leaves the
// network connection to its caller, so dialV5 dials each URL itself.
//
// What v5.go (publishes, server limits), v5session.go (acknowledgements,
// inbound QoS 2) and v5dial.go (CONNECT, one URL after another) add to
// paho.golang, and why:
//   - Acknowledgements. paho.golang's manual ack (EnableManualAcknowledgment)
//     queues acks and sends them from a 50 ms ticker, and its tracker only
//     forgets a message once acked. Instead paho's automatic ack is left on
//     and ignored by v5Session.Ack when Options.ManualAck is set;
//     Message.Ack writes the PUBACK (one write) or the PUBREC (through the
//     session state, which records it) at once, in the order the engine
//     calls it (receive order).
//   - Publishes. paho.golang's Publish blocks its caller while the server's
//     Receive Maximum is used up and offers no completion for an async
//     send. v5Conn queues publications in call order; one goroutine per
//     connection takes a Receive Maximum slot and a packet ID from the
//     session state and writes the packet; the PUBACK/PUBCOMP (or the loss
//     of the connection) completes the Token. PublishAsync never blocks.
//   - Server limits (Maximum QoS, Retain Available, Maximum Packet Size)
//     refuse a publication before anything is sent (ErrExceedsServerLimits).
//   - Inbound QoS 2: paho.golang's session state answers PUBREL with
//     PUBCOMP itself; v5Session reports each PUBREL to OnPubrel first, as
//     the 3.1.1 store does. A QoS 2 publish whose PUBREC says 0x10 (no
//     matching subscribers) is remembered until its PUBCOMP; neither
//     mosquitto 2.0.11 nor mochi v2.7.9 sends that code, so only the PUBACK
//     form of 0x10 is tested.
//   - One session state per connection, like one client: an ack made on
//     a lost connection finds a state without a socket and goes nowhere,
//     and paho never resends old publishes (the outbox does).

// ErrExceedsServerLimits wraps the refusal of a publication the server's
// CONNACK does not allow (QoS above Maximum QoS, retain while Retain
// Available is 0, a packet above Maximum Packet Size). Nothing was sent.
var ErrExceedsServerLimits = errors.New("mqtt: publication exceeds the server's limits")

// v5Conn is one MQTT 5 connection: one paho.golang client on one network
// connection, with its own session state (never reused, like the client).
type v5Conn struct {
	link
	cli     *paho.Client
	session *v5Session
	net     net.Conn // what paho writes to; packets lock it per packet
	pinger  *paho.DefaultPinger
	limits  ServerLimits
	log     Logger

	mu    sync.Mutex
	queue []*v5Token    // publications not yet written, in call order
	wake  chan struct{} // capacity 1: the queue has something
}

var _ Conn = (*v5Conn)(nil)

// Limits are what the server's CONNACK allows.
func (c *v5Conn) Limits() ServerLimits { return c.limits }

// Publish sends one message and waits, bounded by ctx, for its completion.
func (c *v5Conn) Publish(ctx context.Context, p mqttmsg.Publication) error {
	if !c.Alive() {
		return ErrNotConnected
	}
	return c.wait(ctx, c.PublishAsync(p))
}

// PublishAsync checks p against the server's limits and queues it; it
// never blocks. The Token completes with the PUBACK (QoS 1), the PUBCOMP
// (QoS 2) or the write (QoS 0), or fails when the connection is lost.
// A PUBACK or PUBREC reason code of 0x80 or more is a *ReasonCodeError,
// and so is 0x10 (no matching subscribers) with p.RequireSubscribers.
// The queue holds what the caller has started and not seen complete, so
// the caller's own window (the sender's) bounds its memory.
func (c *v5Conn) PublishAsync(p mqttmsg.Publication) Token {
	if !c.Alive() {
		return failedToken{ErrNotConnected}
	}
	pb, err := c.packet(p)
	if err != nil {
		return failedToken{err}
	}
	t := &v5Token{done: make(chan struct{}), pb: pb, requireSubs: p.RequireSubscribers}
	c.mu.Lock()
	c.queue = append(c.queue, t)
	c.mu.Unlock()
	wake(c.wake)
	return t
}

// packet builds the PUBLISH for p and refuses what the server disallows.
func (c *v5Conn) packet(p mqttmsg.Publication) (*packets.Publish, error) {
	if p.QoS > 2 {
		return nil, fmt.Errorf("mqtt: QoS %d does not exist (0, 1 or 2)", p.QoS)
	}
	if p.QoS > c.limits.MaximumQoS {
		return nil, fmt.Errorf("%w: QoS %d on topic %q, but the server's Maximum QoS is %d; publish with a lower qos", ErrExceedsServerLimits, p.QoS, p.Topic, c.limits.MaximumQoS)
	}
	if p.Retained && !c.limits.RetainAvailable {
		return nil, fmt.Errorf("%w: a retained message on topic %q, but the server does not support retained messages (Retain Available 0); publish with retained false", ErrExceedsServerLimits, p.Topic)
	}
	pb := &packets.Publish{
		Topic:      p.Topic,
		QoS:        p.QoS,
		Retain:     p.Retained,
		Payload:    p.Payload,
		Properties: packetProperties(p.Props),
	}
	if max := c.limits.MaximumPacketSize; max > 0 {
		if size := packetSize(pb); size > int(max) {
			return nil, fmt.Errorf("%w: the PUBLISH on topic %q is %d bytes, but the server's Maximum Packet Size is %d", ErrExceedsServerLimits, p.Topic, size, max)
		}
	}
	return pb, nil
}

// packetSize is the size of pb on the wire: fixed header byte, remaining
// length (a variable byte integer) and the rest. A QoS > 0 packet already
// holds its 2-byte packet ID (still 0) in Buffers.
func packetSize(pb *packets.Publish) int {
	rest := 0
	for _, b := range pb.Buffers() {
		rest += len(b)
	}
	vbi := 1
	for n := rest; n > 127; n >>= 7 {
		vbi++
	}
	return 1 + vbi + rest
}

// packetProperties converts Properties to the packet's; never nil.
func packetProperties(p *mqttmsg.Properties) *packets.Properties {
	out := &packets.Properties{}
	if p == nil {
		return out
	}
	for _, u := range p.User {
		out.User = append(out.User, packets.User{Key: u.Key, Value: u.Value})
	}
	out.ContentType = p.ContentType
	out.ResponseTopic = p.ResponseTopic
	out.CorrelationData = p.CorrelationData
	if p.MessageExpiry > 0 {
		// Whole seconds on the wire, rounded up: a positive expiry must not
		// become 0, which means "never expires".
		secs := min((p.MessageExpiry+time.Second-1)/time.Second, math.MaxUint32)
		v := uint32(secs)
		out.MessageExpiry = &v
	}
	return out
}

// messageProperties converts received PUBLISH properties to Properties.
func messageProperties(p *paho.PublishProperties) *mqttmsg.Properties {
	out := &mqttmsg.Properties{}
	if p == nil {
		return out
	}
	for _, u := range p.User {
		out.User = append(out.User, mqttmsg.UserProperty{Key: u.Key, Value: u.Value})
	}
	out.ContentType = p.ContentType
	out.ResponseTopic = p.ResponseTopic
	out.CorrelationData = p.CorrelationData
	if p.MessageExpiry != nil {
		out.MessageExpiry = time.Duration(*p.MessageExpiry) * time.Second
	}
	return out
}

// sendLoop writes the queued publications in order until the connection is
// lost, then fails what is left. A QoS 1/2 publication first waits for a
// Receive Maximum slot (AddToSession), so a full window holds the queue,
// not the callers of PublishAsync.
func (c *v5Conn) sendLoop() {
	defer c.failQueued()
	for {
		c.mu.Lock()
		var t *v5Token
		if len(c.queue) > 0 {
			t = c.queue[0]
			c.queue[0] = nil
			c.queue = c.queue[1:]
		}
		c.mu.Unlock()
		if t == nil {
			select {
			case <-c.wake:
				continue
			case <-c.Lost():
				return
			}
		}
		if !c.send(t) {
			return
		}
	}
}

// send writes one publication; false when the connection is gone.
// Nothing is written once the Conn is lost, Drop included.
func (c *v5Conn) send(t *v5Token) bool {
	if !c.Alive() {
		t.complete(ErrNotConnected)
		return false
	}
	if t.pb.QoS == 0 {
		err := c.write(t.pb)
		t.complete(err)
		return err == nil
	}
	ret := make(chan packets.ControlPacket, 1)
	if err := c.session.AddToSession(c.ctx, t.pb, ret); err != nil {
		if errors.Is(err, session.ErrNoConnection) || !c.Alive() {
			c.markLost() // the state saw the connection go first
			t.complete(ErrNotConnected)
			return false
		}
		t.complete(fmt.Errorf("mqtt: publish to %q: %w", t.pb.Topic, err))
		return true
	}
	go c.await(t, ret)
	if !c.Alive() { // lost while waiting for a Receive Maximum slot
		return false
	}
	return c.write(t.pb) == nil
}

// write sends one packet in one write call, holding the lock paho's own
// packet writes take (packets.NewThreadSafeConn): paho writes a packet as
// four calls, four segments on the wire with TCP_NODELAY.
func (c *v5Conn) write(pk io.WriterTo) error {
	var buf bytes.Buffer
	_, _ = pk.WriteTo(&buf) // a bytes.Buffer does not fail
	lock := c.net.(sync.Locker)
	lock.Lock()
	_, err := c.net.Write(buf.Bytes())
	lock.Unlock()
	// A failed write loses the connection: paho's reader sees the broken
	// socket too, but the Conn must not wait for it.
	if err != nil {
		c.log.Debugf("MQTT write failed: %v", err)
		c.markLost()
		return ErrNotConnected
	}
	c.pinger.PacketSent()
	return nil
}

// await completes t with the server's answer, or fails it when the
// connection is lost first (the session state of a lost connection never
// answers).
func (c *v5Conn) await(t *v5Token, ret <-chan packets.ControlPacket) {
	select {
	case resp := <-ret:
		t.complete(c.session.result(t, resp))
	case <-c.Lost():
		t.complete(ErrNotConnected)
	}
}

func (c *v5Conn) failQueued() {
	c.mu.Lock()
	q := c.queue
	c.queue = nil
	c.mu.Unlock()
	for _, t := range q {
		t.complete(ErrNotConnected)
	}
}

// v5Token is a queued or in-flight publication.
type v5Token struct {
	done        chan struct{}
	err         error
	pb          *packets.Publish
	requireSubs bool
}

func (t *v5Token) Done() <-chan struct{} { return t.done }

// Error is the publication's outcome; call it after Done is closed.
func (t *v5Token) Error() error {
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

func (t *v5Token) complete(err error) {
	t.err = err
	close(t.done)
}

// Subscribe subscribes to filters and waits, bounded by ctx and the
// connection, for the SUBACK. A refused filter is a *ReasonCodeError
// naming it; a refusal of the packet ID (0x91) is retried under the next
// one (subscribe.go).
func (c *v5Conn) Subscribe(ctx context.Context, filters map[string]byte) error {
	if len(filters) == 0 {
		return nil
	}
	names := keys(filters)
	slices.Sort(names)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(c.ctx, cancel)
	defer stop()
	return subscribeRetryingInUse(ctx, c.log, names, func() error { return c.subscribeOnce(ctx, names, filters) })
}

// subscribeOnce sends one SUBSCRIBE and waits for its SUBACK.
func (c *v5Conn) subscribeOnce(ctx context.Context, names []string, filters map[string]byte) error {
	sub := &paho.Subscribe{}
	for _, f := range names {
		sub.Subscriptions = append(sub.Subscriptions, paho.SubscribeOptions{Topic: f, QoS: filters[f]})
	}
	sa, err := c.cli.Subscribe(ctx, sub)
	if sa != nil {
		for i, code := range sa.Reasons {
			if code >= 0x80 && i < len(names) {
				e := &ReasonCodeError{Packet: "SUBACK", Code: code, Filter: names[i]}
				if sa.Properties != nil {
					e.Reason = sa.Properties.ReasonString
				}
				if e.Reason == "" {
					e.Reason = (&packets.Suback{Reasons: sa.Reasons}).Reason(i)
				}
				return fmt.Errorf("subscribe: the broker refused a filter (check its ACLs and the filter syntax): %w", e)
			}
		}
	}
	if err != nil {
		if !c.Alive() {
			err = ErrNotConnected
		}
		return fmt.Errorf("subscribe %v: %w", names, err)
	}
	return nil
}

// disconnect sends DISCONNECT (reason 0: the session is kept for its
// expiry interval) and waits, at most disconnectWait, for the broker to
// close the connection: the broker then has handled every ack written
// before it (Message.Ack writes at once, so nothing else needs flushing).
// Closing first could let a reconnect reach the broker before the acks,
// and a session takeover discards what the old connection had not read.
func (c *v5Conn) disconnect(bool) {
	c.markLost()
	_ = c.net.SetWriteDeadline(time.Now().Add(disconnectWait))
	if _, err := (&packets.Disconnect{Properties: &packets.Properties{}}).WriteTo(c.net); err == nil {
		select {
		case <-c.cli.Done():
		case <-time.After(disconnectWait):
		}
	}
	_ = c.net.Close()
	// paho's workers end with the network connection; one stuck in a
	// handler must not hold up the reconnect loop or Close for good.
	select {
	case <-c.cli.Done():
	case <-time.After(disconnectWait):
		c.log.Warnf("MQTT 5 client did not stop within %s of its connection closing; continuing without it", disconnectWait)
	}
}

// disconnectWait bounds each step of disconnect.
const disconnectWait = time.Second
