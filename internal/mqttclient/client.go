// Package mqttclient is the connection layer every reliable-mqtt component
// uses: broker URLs (including embedded://), credentials, TLS, will, and a
// reconnect loop with explicit connection state.
//
// The engines see only the Transport and Conn interfaces (plus Message and
// Token); Client implements them for MQTT 3.1.1 on paho.mqtt.golang, so a
// second protocol is a second implementation, not a change to the engines.
//
// Each connection is a fresh paho client, called a Conn. That is deliberate:
// paho's own auto-reconnect hides the CONNACK's session-present flag, keeps
// resending old publishes from its store, and lets a manual ack from a dead
// connection leak onto the next one. With one paho client per connection,
// an ack or publish made on a Conn that has been lost goes nowhere, and the
// broker's redelivery arrives as a new message on the new Conn.
package mqttclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/benthoslog"
	"github.com/reliable-mqtt/reliable-mqtt/internal/embedded"
)

// ErrNotConnected is returned when an operation needs a live connection.
var ErrNotConnected = errors.New("mqtt: not connected")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("mqtt: client closed")

// Message is one received PUBLISH, as the components see it: they never
// name the MQTT library. Ack sends its PUBACK (QoS 1) or PUBREC (QoS 2);
// with Options.ManualAck nothing is acknowledged until it is called.
type Message interface {
	Topic() string
	Qos() byte
	MessageID() uint16
	Duplicate() bool
	Retained() bool
	Payload() []byte
	// Properties are the MQTT 5 PUBLISH properties; nil on 3.1.1.
	Properties() *Properties
	Ack()
}

// v3Message is a paho.mqtt.golang message: MQTT 3.1.1 has no properties.
type v3Message struct{ paho.Message }

func (v3Message) Properties() *Properties { return nil }

// failedToken is a publish that failed before it was sent.
type failedToken struct{ err error }

func (failedToken) Done() <-chan struct{} { return closedChan }
func (t failedToken) Error() error        { return t.err }

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Token is a publish in progress: Done is closed at its completion (PUBACK
// for QoS 1), then Error reports whether it failed.
type Token interface {
	Done() <-chan struct{}
	Error() error
}

// Transport is what the engines (internal/inbox, internal/sender) and the
// plugins need from an MQTT client: a connection kept alive with its
// session, and the current connection. Client (MQTT 3.1.1 on
// paho.mqtt.golang) implements it; a second protocol implements the same
// Transport and Conn, and the engines do not change.
type Transport interface {
	// WaitReady waits, bounded by ctx, for a ready connection.
	WaitReady(ctx context.Context) (Conn, error)
	// Current returns the ready connection, or nil while there is none.
	Current() Conn
	// Close disconnects without ending the session. Bounded by ctx.
	Close(ctx context.Context) error
}

// Conn is one connection of a Transport, never reused after it is lost.
// Distinct connections are distinct values, so a Conn can key a map.
// Inbound messages are acknowledged in order with Message.Ack.
type Conn interface {
	// Gen numbers the connections of one Transport, starting at 1.
	Gen() uint64
	// SessionPresent is the CONNACK's flag: the broker resumed a session.
	SessionPresent() bool
	// Lost is closed when the connection is gone.
	Lost() <-chan struct{}
	// Alive reports whether the connection has not been lost.
	Alive() bool
	// Drop closes the connection on purpose; it never blocks.
	Drop(reason error)
	// Publish sends one message and waits, bounded by ctx, for its completion.
	Publish(ctx context.Context, p Publication) error
	// PublishAsync starts a publish and returns its completion.
	PublishAsync(p Publication) Token
	// Limits are what the server's CONNACK allows (NoLimits on 3.1.1).
	Limits() ServerLimits
	// Subscribe subscribes and waits, bounded by ctx, for the SUBACK; a
	// refused filter is an error.
	Subscribe(ctx context.Context, filters map[string]byte) error
}

// Handlers are the hooks a component installs. All are optional.
type Handlers struct {
	// OnMessage receives every PUBLISH of the connection, in receive order.
	// It is installed before CONNECT, so a resumed session's early messages
	// are never dropped unacknowledged by paho. It runs on paho's network
	// reader and must never block: a blocked reader misses PINGRESPs and
	// the connection dies ("pingresp not received").
	OnMessage func(conn Conn, msg Message)
	// OnConnect runs after each CONNACK and before the connection counts as
	// ready (e.g. to SUBSCRIBE and wait for the SUBACK). An error drops the
	// connection and a new attempt follows after the backoff.
	OnConnect func(ctx context.Context, conn Conn) error
	// OnPubrel receives the packet ID of each PUBREL the broker sends (the
	// end of an inbound QoS 2 exchange; paho answers it with PUBCOMP by
	// itself). It runs on paho's network reader before any later packet is
	// handled, and must never block.
	OnPubrel func(conn Conn, id uint16)
}

// pubrelStore is paho's memory store that reports PUBRELs: paho puts an
// inbound PUBREL into its store on arrival, and offers no other hook.
type pubrelStore struct {
	*paho.MemoryStore
	onPubrel func(id uint16)
}

func (s *pubrelStore) Put(key string, m packets.ControlPacket) {
	if rel, ok := m.(*packets.PubrelPacket); ok && strings.HasPrefix(key, "i.") {
		s.onPubrel(rel.MessageID)
	}
	s.MemoryStore.Put(key, m)
}

// Options configure a Client beyond the user's Config.
type Options struct {
	// ManualAck disables paho's automatic PUBACK/PUBREC: the caller acks
	// each message with msg.Ack() when it is safe to.
	ManualAck bool
	Logger    *service.Logger
}

// pahoConn is one MQTT 3.1.1 connection: one paho client.
type pahoConn struct {
	gen            uint64
	sessionPresent bool

	paho     paho.Client
	lostOnce sync.Once
	lost     chan struct{}

	dropMu  sync.Mutex
	dropErr error // why Drop closed the connection; nil otherwise
}

func (c *pahoConn) Gen() uint64 { return c.gen }

func (c *pahoConn) SessionPresent() bool { return c.sessionPresent }

// Lost is closed when the connection is gone.
func (c *pahoConn) Lost() <-chan struct{} { return c.lost }

// Alive reports whether the connection has not been lost.
func (c *pahoConn) Alive() bool {
	select {
	case <-c.lost:
		return false
	default:
		return true
	}
}

func (c *pahoConn) markLost() { c.lostOnce.Do(func() { close(c.lost) }) }

// Drop closes the connection on purpose, e.g. when a component must fail
// closed. It never blocks, so it may be called from OnMessage. Nothing more
// is sent on this Conn (acks and publishes go nowhere). The Client
// reconnects after its backoff delay, which grows while connections keep
// being dropped, so a drop that repeats on every connection cannot spin.
func (c *pahoConn) Drop(reason error) {
	c.dropMu.Lock()
	if c.dropErr == nil {
		c.dropErr = reason
	}
	c.dropMu.Unlock()
	c.markLost()
}

// dropReason returns the reason given to Drop, or nil.
func (c *pahoConn) dropReason() error {
	c.dropMu.Lock()
	defer c.dropMu.Unlock()
	return c.dropErr
}

// Publish sends one message and waits, bounded by ctx, for its completion
// (PUBACK for QoS 1, PUBCOMP for QoS 2, the write for QoS 0).
func (c *pahoConn) Publish(ctx context.Context, p Publication) error {
	if !c.Alive() {
		return ErrNotConnected
	}
	return c.wait(ctx, c.PublishAsync(p))
}

// PublishAsync starts a publish and returns its token.
func (c *pahoConn) PublishAsync(p Publication) Token {
	if p.Props != nil {
		return failedToken{ErrNeedsV5}
	}
	return c.paho.Publish(p.Topic, p.QoS, p.Retained, p.Payload)
}

// Limits are NoLimits: MQTT 3.1.1 has no way to state any.
func (c *pahoConn) Limits() ServerLimits { return NoLimits }

// Subscribe subscribes to filters and waits, bounded by ctx, for the SUBACK.
// A filter the broker refuses (return code 0x80) is an error.
func (c *pahoConn) Subscribe(ctx context.Context, filters map[string]byte) error {
	if len(filters) == 0 {
		return nil
	}
	tok := c.paho.SubscribeMultiple(filters, nil)
	if err := c.wait(ctx, tok); err != nil {
		return fmt.Errorf("subscribe %v: %w", keys(filters), err)
	}
	st, ok := tok.(*paho.SubscribeToken)
	if !ok {
		return nil
	}
	for f, code := range st.Result() {
		if code == 0x80 {
			return fmt.Errorf("subscribe: the broker refused filter %q (SUBACK 0x80): check its ACLs and the filter syntax", f)
		}
	}
	return nil
}

// wait waits for a paho token without blocking past ctx or the connection.
// paho's token.Wait ignores contexts, so select on Done instead.
func (c *pahoConn) wait(ctx context.Context, tok Token) error {
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	case <-c.lost:
		return ErrNotConnected
	}
}

func keys(m map[string]byte) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

var (
	_ Transport = (*Client)(nil)
	_ Conn      = (*pahoConn)(nil)
)

// Client keeps one connection to the broker alive, reconnecting with backoff
// until Close.
type Client struct {
	cfg  Config
	h    Handlers
	opts Options
	log  *service.Logger

	brokerURLs []string
	embedded   []*embedded.Broker

	mu      sync.Mutex
	current *pahoConn     // ready connection, nil while down
	changed chan struct{} // closed and replaced on every state change
	gen     uint64

	closing chan struct{}
	done    chan struct{}
}

// Start resolves the broker URLs (starting embedded brokers) and begins
// connecting in the background with the protocol cfg names. It returns
// without waiting for a broker.
func Start(cfg Config, h Handlers, opts Options) (Transport, error) {
	if cfg.ProtocolVersion == V5 {
		return startV5(cfg, h, opts)
	}
	return startV311(cfg, h, opts)
}

// startV311 starts a Client: MQTT 3.1.1 on paho.mqtt.golang.
func startV311(cfg Config, h Handlers, opts Options) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ClientID == "" {
		return nil, errors.New("mqtt: client_id must not be empty")
	}
	c := &Client{
		cfg: cfg, h: h, opts: opts, log: opts.Logger,
		changed: make(chan struct{}),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	// The embedded broker logs through this component's logger.
	var eo []embedded.Option
	if opts.Logger != nil {
		eo = append(eo, embedded.WithLog(benthoslog.Handler(opts.Logger)))
	}
	for _, raw := range cfg.URLs {
		if !embedded.IsEmbedded(raw) {
			c.brokerURLs = append(c.brokerURLs, raw)
			continue
		}
		b, err := embedded.Acquire(raw, eo...)
		if err != nil {
			c.releaseEmbedded()
			return nil, fmt.Errorf("start embedded broker %q: %w", raw, err)
		}
		c.embedded = append(c.embedded, b)
		c.brokerURLs = append(c.brokerURLs, b.ClientURL())
	}
	go c.loop()
	return c, nil
}

func (c *Client) releaseEmbedded() {
	for _, b := range c.embedded {
		if err := b.Release(); err != nil && c.log != nil {
			c.log.Warnf("Closing embedded broker %s: %v", b.Dir(), err)
		}
	}
	c.embedded = nil
}

// Current returns the ready connection, or nil while there is none.
func (c *Client) Current() Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current == nil {
		return nil // a nil interface, not a nil *pahoConn
	}
	return c.current
}

// WaitReady waits, bounded by ctx, for a ready connection.
func (c *Client) WaitReady(ctx context.Context) (Conn, error) {
	for {
		c.mu.Lock()
		cur, ch := c.current, c.changed
		c.mu.Unlock()
		if cur != nil && cur.Alive() {
			return cur, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.closing:
			return nil, ErrClosed
		}
	}
}

func (c *Client) setCurrent(conn *pahoConn) {
	c.mu.Lock()
	c.current = conn
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// Close disconnects (without UNSUBSCRIBE, so a persistent session and its
// queued messages survive) and stops reconnecting. Bounded by ctx.
func (c *Client) Close(ctx context.Context) error {
	select {
	case <-c.closing:
	default:
		close(c.closing)
	}
	var err error
	select {
	case <-c.done:
	case <-ctx.Done():
		err = fmt.Errorf("mqtt: close timed out: %w", ctx.Err())
	}
	// Even after a timeout: the loop no longer needs the broker once it
	// sees closing, and a leaked reference would keep it running.
	c.releaseEmbedded()
	return err
}

func (c *Client) loop() {
	defer close(c.done)
	delay := c.cfg.Reconnect.Initial
	for {
		select {
		case <-c.closing:
			return
		default:
		}
		conn, err := c.connect()
		if err != nil {
			if c.log != nil {
				c.log.Warnf("MQTT connection to %v failed, retrying in %s: %v", c.cfg.URLs, delay, err)
			}
			select {
			case <-time.After(delay):
			case <-c.closing:
				return
			}
			delay = c.cfg.Reconnect.Next(delay)
			continue
		}
		c.setCurrent(conn)
		if c.log != nil {
			c.log.Infof("MQTT connected to %v as %q (session present: %v)", c.cfg.URLs, c.cfg.ClientID, conn.sessionPresent)
		}
		select {
		case <-conn.lost:
			c.setCurrent(nil)
			if c.log != nil {
				c.log.Warnf("MQTT connection to %v lost; reconnecting", c.cfg.URLs)
			}
			conn.paho.Disconnect(0)
			if conn.dropReason() == nil {
				delay = c.cfg.Reconnect.Initial
				continue
			}
			// A dropped connection counts as a failed attempt: back off.
			select {
			case <-time.After(delay):
			case <-c.closing:
				return
			}
			delay = c.cfg.Reconnect.Next(delay)
		case <-c.closing:
			c.setCurrent(nil)
			// DISCONNECT without UNSUBSCRIBE: the session stays at the broker.
			conn.paho.Disconnect(250)
			conn.markLost()
			return
		}
	}
}

// connect makes one connection attempt, runs OnConnect and returns the
// ready connection.
func (c *Client) connect() (*pahoConn, error) {
	c.gen++
	conn := &pahoConn{gen: c.gen, lost: make(chan struct{})}
	o := paho.NewClientOptions().
		SetClientID(c.cfg.ClientID).
		SetCleanSession(c.cfg.CleanSession).
		SetUsername(c.cfg.User).
		SetPassword(c.cfg.Password).
		SetKeepAlive(c.cfg.KeepAlive).
		SetPingTimeout(c.cfg.ConnectTimeout).
		SetConnectTimeout(c.cfg.ConnectTimeout).
		SetWriteTimeout(c.cfg.ConnectTimeout).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetResumeSubs(false).
		// Receive order is needed to PUBACK in order (MQTT 3.1.1 §4.6);
		// OnMessage is therefore required never to block.
		SetOrderMatters(true).
		SetAutoAckDisabled(c.opts.ManualAck).
		SetCustomOpenConnectionFn(openBuffered). // packets leave in fewer write(2)s (bufconn.go)
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			if c.log != nil && err != nil {
				c.log.Debugf("MQTT connection lost: %v", err)
			}
			conn.markLost()
		})
	for _, u := range c.brokerURLs {
		o.AddBroker(u)
	}
	if c.cfg.TLS != nil {
		o.SetTLSConfig(c.cfg.TLS)
	}
	if w := c.cfg.Will; w != nil {
		o.SetBinaryWill(w.Topic, w.Payload, w.QoS, w.Retained)
	}
	if c.h.OnMessage != nil {
		o.SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) { c.h.OnMessage(conn, v3Message{m}) })
	}
	if c.h.OnPubrel != nil {
		o.SetStore(&pubrelStore{MemoryStore: paho.NewMemoryStore(), onPubrel: func(id uint16) { c.h.OnPubrel(conn, id) }})
	}
	conn.paho = paho.NewClient(o)

	// paho tries the URLs in order, each with its own connect_timeout, so
	// a node that accepts TCP and never answers must not use up the whole
	// attempt before the next URL is tried.
	tok := conn.paho.Connect()
	select {
	case <-tok.Done():
	case <-time.After(time.Duration(len(c.brokerURLs))*c.cfg.ConnectTimeout + time.Second):
		conn.paho.Disconnect(0)
		return nil, errors.New("connect timed out")
	case <-c.closing:
		conn.paho.Disconnect(0)
		return nil, ErrClosed
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	if ct, ok := tok.(*paho.ConnectToken); ok {
		conn.sessionPresent = ct.SessionPresent()
	}
	if c.h.OnConnect != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ConnectTimeout)
		go func() {
			select {
			case <-c.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := c.h.OnConnect(ctx, conn)
		cancel()
		if err != nil {
			// On Close, let paho write what it was already handed (acks of
			// messages that arrived before the SUBACK), as the ready path does.
			quiesce := uint(0)
			select {
			case <-c.closing:
				quiesce = 250
			default:
			}
			conn.paho.Disconnect(quiesce)
			conn.markLost()
			return nil, fmt.Errorf("after connect: %w", err)
		}
	}
	return conn, nil
}
