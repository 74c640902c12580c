// Package mqttclient is the connection layer every reliable-mqtt component
// uses: broker URLs, credentials, TLS, will, and a reconnect loop with
// explicit connection state. It starts no broker: an embedded:// URL is
// resolved beside it (embedded.StartClient starts that broker, then the
// client with the broker's URL).
//
// The engines see only the Transport and Conn interfaces (plus Message and
// Token). Client implements them with one reconnect loop and a dialer per
// protocol: MQTT 3.1.1 on paho.mqtt.golang (v311.go) and MQTT 5 on
// paho.golang (v5.go), so the engines do not change with the protocol.
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
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// ErrNotConnected is returned when an operation needs a live connection.
var ErrNotConnected = errors.New("mqtt: not connected")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("mqtt: client closed")

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
	// Context ends when the connection is gone (its Done is Lost): work
	// that is stale once the connection is lost derives its context from
	// it, with no goroutine of its own.
	Context() context.Context
	// Alive reports whether the connection has not been lost.
	Alive() bool
	// Drop closes the connection on purpose; it never blocks.
	Drop(reason error)
	// Publish sends one message and waits, bounded by ctx, for its completion.
	Publish(ctx context.Context, p mqttmsg.Publication) error
	// PublishAsync starts a publish and returns its completion.
	PublishAsync(p mqttmsg.Publication) Token
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
	// are never dropped unacknowledged by paho. It must never block: on
	// 3.1.1 it runs on paho's network reader, and a blocked reader misses
	// PINGRESPs and the connection dies ("pingresp not received"); on 5 it
	// runs on paho.golang's router goroutine, whose queue of Receive
	// Maximum messages stalls the reader once full.
	OnMessage func(conn Conn, msg mqttmsg.Message)
	// OnConnect runs after each CONNACK and before the connection counts as
	// ready (e.g. to SUBSCRIBE and wait for the SUBACK). An error drops the
	// connection and a new attempt follows after the backoff.
	OnConnect func(ctx context.Context, conn Conn) error
	// OnPubrel receives the packet ID of each PUBREL the broker sends (the
	// end of an inbound QoS 2 exchange; paho answers it with PUBCOMP by
	// itself). It runs on paho's network reader before any later packet is
	// handled (both protocols), and must never block.
	OnPubrel func(conn Conn, id uint16)
	// OnLink is told true when a connection is ready and false when it is
	// lost or closed, on the client's own goroutine (a connected gauge
	// follows the link with or without traffic). It must never block.
	OnLink func(up bool)
}

// Options configure a Client beyond the user's Config.
type Options struct {
	// ManualAck disables paho's automatic PUBACK/PUBREC: the caller acks
	// each message with msg.Ack() when it is safe to.
	ManualAck bool
	Logger    Logger // nil: the client logs nothing
	// ConfiguredURLs are the URLs as the user wrote them, index for index
	// with Config.URLs, for messages (an embedded:// URL resolved to the
	// broker's loopback address); nil: Config.URLs.
	ConfiguredURLs []string
}

// Logger is what the client logs through (Benthos's *service.Logger fits).
type Logger interface {
	Debugf(format string, args ...any)
	Infof(format string, args ...any)
	Warnf(format string, args ...any)
}

// quiet is the Logger of a client given none.
type quiet struct{}

func (quiet) Debugf(string, ...any) {}
func (quiet) Infof(string, ...any)  {}
func (quiet) Warnf(string, ...any)  {}

// link is what every connection has, whatever its protocol: its number,
// the CONNACK's session flag, and whether (and why) it was lost.
type link struct {
	gen            uint64
	sessionPresent bool
	broker         string // the URL this connection reached, for the log

	// ctx is cancelled when the connection is lost; its Done is Lost.
	ctx     context.Context
	cancel  context.CancelFunc
	dropMu  sync.Mutex
	dropErr error // why Drop closed the connection; nil otherwise
}

func newLink(gen uint64) link {
	ctx, cancel := context.WithCancel(context.Background())
	return link{gen: gen, ctx: ctx, cancel: cancel}
}

func (l *link) Gen() uint64 { return l.gen }

func (l *link) SessionPresent() bool { return l.sessionPresent }

// Lost is closed when the connection is gone.
func (l *link) Lost() <-chan struct{} { return l.ctx.Done() }

// Context ends when the connection is gone.
func (l *link) Context() context.Context { return l.ctx }

// Alive reports whether the connection has not been lost.
func (l *link) Alive() bool { return l.ctx.Err() == nil }

func (l *link) markLost() { l.cancel() }

// Drop closes the connection on purpose, e.g. when a component must fail
// closed. It never blocks, so it may be called from OnMessage. Nothing more
// is sent on this Conn (acks and publishes go nowhere). The Client
// reconnects after its backoff delay, which grows while connections keep
// being dropped, so a drop that repeats on every connection cannot spin.
func (l *link) Drop(reason error) {
	l.dropMu.Lock()
	if l.dropErr == nil {
		l.dropErr = reason
	}
	l.dropMu.Unlock()
	l.markLost()
}

// dropReason returns the reason given to Drop, or nil.
func (l *link) dropReason() error {
	l.dropMu.Lock()
	defer l.dropMu.Unlock()
	return l.dropErr
}

// wait waits for a token without blocking past ctx or the connection.
func (l *link) wait(ctx context.Context, tok Token) error {
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	case <-l.Lost():
		return ErrNotConnected
	}
}

// conn is a Conn as the Client's loop handles it.
type conn interface {
	Conn
	base() *link
	// disconnect sends DISCONNECT (keeping the session) and closes the
	// network connection, in bounded time. closing says the Client is
	// closing rather than reconnecting.
	disconnect(closing bool)
}

func (l *link) base() *link { return l }

// dialer makes one connection attempt of a protocol: every URL in order,
// each with its own connect_timeout, up to the CONNACK. It returns early
// with ErrClosed when closing is closed.
type dialer func(gen uint64, closing <-chan struct{}) (conn, error)

var _ Transport = (*Client)(nil)

// Client keeps one connection to the broker alive, reconnecting with backoff
// until Close. The protocol is only in its dialer: the loop, the backoff,
// and OnConnect are the same for 3.1.1 and 5.
type Client struct {
	cfg  Config
	h    Handlers
	opts Options
	log  Logger // never nil
	dial dialer

	brokerURLs []string // what is dialled: cfg.URLs
	shownURLs  []string // what messages name: Options.ConfiguredURLs

	mu      sync.Mutex
	current conn          // ready connection, nil while down
	changed chan struct{} // closed and replaced on every state change
	gen     uint64

	closing chan struct{}
	done    chan struct{}
}

// Starter starts a client, and whatever must run beside it (the broker of
// an embedded:// URL: embedded.StartClient), with the caller's handlers.
type Starter func(Config, Handlers) (Transport, error)

// Start begins connecting in the background with the protocol cfg names. It returns
// without waiting for a broker.
func Start(cfg Config, h Handlers, opts Options) (Transport, error) {
	c, err := newClient(cfg, h, opts)
	if err != nil {
		return nil, err
	}
	if cfg.ProtocolVersion == V5 {
		c.dial = c.dialV5
	} else {
		c.dial = c.dialV311
	}
	go c.loop()
	return c, nil
}

// newClient checks cfg.
func newClient(cfg Config, h Handlers, opts Options) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ClientID == "" {
		return nil, errors.New("mqtt: client_id must not be empty")
	}
	log := opts.Logger
	if log == nil {
		log = quiet{}
	}
	c := &Client{
		cfg: cfg, h: h, opts: opts, log: log,
		changed: make(chan struct{}),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	c.brokerURLs, c.shownURLs = cfg.URLs, cfg.URLs
	if len(opts.ConfiguredURLs) == len(cfg.URLs) {
		c.shownURLs = opts.ConfiguredURLs
	}
	return c, nil
}

// Current returns the ready connection, or nil while there is none.
func (c *Client) Current() Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current == nil {
		return nil // a nil interface, not a nil *v311Conn
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

func (c *Client) setCurrent(conn conn) {
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
	return err
}

func (c *Client) loop() {
	defer close(c.done)
	failures := 0 // consecutive failed attempts (and drops): the backoff's step
	for {
		select {
		case <-c.closing:
			return
		default:
		}
		conn, err := c.connect()
		if err != nil {
			failures++
			delay := c.cfg.Reconnect.After(failures)
			c.log.Warnf("MQTT connection to %v failed, retrying in %s: %v", c.shownURLs, delay, err)
			select {
			case <-time.After(delay):
			case <-c.closing:
				return
			}
			continue
		}
		c.setCurrent(conn)
		c.onLink(true)
		c.log.Infof("MQTT connected to %s as %q (protocol %s, session present: %v)", c.chosen(conn), c.cfg.ClientID, c.protocol(), conn.SessionPresent())
		select {
		case <-conn.Lost():
			c.setCurrent(nil)
			c.onLink(false)
			c.log.Warnf("MQTT connection to %v lost; reconnecting", c.shownURLs)
			conn.disconnect(false)
			if conn.base().dropReason() == nil {
				failures = 0
				continue
			}
			// A dropped connection counts as a failed attempt: back off.
			failures++
			select {
			case <-time.After(c.cfg.Reconnect.After(failures)):
			case <-c.closing:
				return
			}
		case <-c.closing:
			c.setCurrent(nil)
			c.onLink(false)
			// DISCONNECT without UNSUBSCRIBE: the session stays at the broker.
			conn.disconnect(true)
			conn.base().markLost()
			return
		}
	}
}

func (c *Client) onLink(up bool) {
	if c.h.OnLink != nil {
		c.h.OnLink(up)
	}
}

// chosen names the broker conn reached: its URL, and which of the
// configured URLs it is when there are several (an embedded broker's URL
// is the one it listens on).
func (c *Client) chosen(conn conn) string {
	b := conn.base().broker
	if b == "" || len(c.brokerURLs) == 1 {
		return fmt.Sprint(c.shownURLs)
	}
	for i, u := range c.brokerURLs {
		if u == b {
			return fmt.Sprintf("%s (URL %d of %d)", c.shownURLs[i], i+1, len(c.brokerURLs))
		}
	}
	return b
}

func (c *Client) protocol() string {
	if c.cfg.ProtocolVersion == V5 {
		return "5"
	}
	return V311
}

// connect makes one connection attempt, runs OnConnect and returns the
// ready connection.
func (c *Client) connect() (conn, error) {
	c.gen++
	conn, err := c.dial(c.gen, c.closing)
	if err != nil {
		return nil, err
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
			// On Close, let what was already handed over go out (acks of
			// messages that arrived before the SUBACK), as the ready path does.
			closing := false
			select {
			case <-c.closing:
				closing = true
			default:
			}
			conn.disconnect(closing)
			conn.base().markLost()
			return nil, fmt.Errorf("after connect: %w", err)
		}
	}
	return conn, nil
}
