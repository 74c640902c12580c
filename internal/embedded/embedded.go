// Package embedded runs the in-process MQTT broker behind `embedded://` URLs.
// A client does not start it: StartClient starts the brokers a config's
// URLs name, then the client (internal/mqttclient) with their addresses.
//
// Any MQTT component configured with `urls: [embedded://...]` gets a mochi
// broker (github.com/mochi-mqtt/server/v2) started once per process per data
// directory and shared, reference-counted, by every component that names the
// same directory. Its state lives in DIR/broker.db (bbolt) and survives both a
// graceful restart and a SIGKILL of the process: client sessions, their
// subscriptions, messages queued for offline persistent sessions (QoS 1 and
// 2, with their packet IDs) and retained messages. A PUBACK (or PUBREC) from
// this broker means the message is on disk: one fsync per publish, shared by
// concurrent publishers. After a crash, messages may be delivered again
// (at-least-once), never lost once acknowledged to the publisher (within
// the max_inflight/max_queued limits below). Will messages are the
// exception: mochi publishes them outside the hooks that make a publish
// durable, so a crash right after a client died can lose its will. A
// disconnected MQTT 5 session and a message with an expiry interval go,
// and a delayed will is sent, after that interval of time this process
// observed, whatever the wall clock does (expiry.go).
//
// URL form:
//
//		embedded://[?dir=PATH][&listen=HOST:PORT][&users=FILE][&acl=FILE]
//		           [&tls_cert=FILE&tls_key=FILE][&max_inflight=N][&max_queued=N]
//
//	  - dir: data directory (default ./reliable-mqtt-data/broker, created if
//	    missing). URLs naming the same directory share one broker.
//	  - listen: an extra TCP listener so other processes (mosquitto_sub, a
//	    second pipeline) can connect, e.g. listen=127.0.0.1:1883. Without it
//	    the broker is reachable only from this process. An address that is
//	    not loopback is refused unless users is set.
//	  - users: a mosquitto password file (user:hash lines; bcrypt or
//	    mosquitto_passwd's $7$): clients of the listen listener must log in.
//	  - acl: a YAML file of per-user topic rights for listen clients,
//	    `user: {read: [filters], write: [filters]}`; what is not listed is
//	    denied (mochi drops a refused PUBLISH and closes that connection).
//	  - tls_cert, tls_key: serve the listen listener over TLS.
//	  - max_inflight: QoS 1/2 messages the broker holds per client, sent but
//	    unacknowledged or queued while it is offline (1–65535, default 65535;
//	    MQTT packet IDs cap it at 65535). Beyond it the broker drops messages
//	    for that client. An MQTT 5 client's Receive Maximum is not applied
//	    (receiveMaxHook says why): this bound is the only one.
//	  - max_queued: packets waiting to be written to one connected client
//	    (default 100000; mochi's own default is 8192).
//
// Nothing else is accepted: a host, a path or an unknown parameter is an
// error, so a typo never silently starts a broker somewhere unexpected.
//
// In-process clients connect to ClientURL(), a private listener on
// 127.0.0.1 with a port chosen by the kernel.
package embedded

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/reliable-mqtt/reliable-mqtt/internal/registry"
	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
)

// Scheme is the URL scheme that selects the embedded broker.
const Scheme = "embedded"

// DefaultDir is the data directory used when the URL names none.
const DefaultDir = "./reliable-mqtt-data/broker"

const (
	paramDir         = "dir"
	paramListen      = "listen"
	paramMaxInflight = "max_inflight"
	paramMaxQueued   = "max_queued"
	paramUsers       = "users"
	paramACL         = "acl"
	paramTLSCert     = "tls_cert"
	paramTLSKey      = "tls_key"

	// privateListener is the ID of the in-process listener.
	privateListener = "in-process"

	defaultMaxInflight = math.MaxUint16
	defaultMaxQueued   = 100000

	// closeTimeout bounds Release of the last reference: mochi waits for every
	// client goroutine, and a stuck one must not hang the caller's shutdown.
	closeTimeout = shutdown.Commit
)

// Config is a parsed `embedded://` URL.
type Config struct {
	Dir         string // data directory as written in the URL (or DefaultDir)
	Listen      string // extra TCP listener address; empty = in-process only
	MaxInflight uint16 // per-client limit of unacknowledged/queued QoS>0 messages
	MaxQueued   int32  // per-client limit of packets waiting to be written
	Users       string // password file for listen clients; empty = no login
	ACL         string // per-user topic rights for listen clients; empty = all
	TLSCert     string // certificate and key of the listen listener
	TLSKey      string

	// Log receives the broker's log records; nil = warnings and errors to
	// stderr. Not part of the URL: the component that starts the broker
	// passes its own logger (WithLog), so level and format follow its config.
	Log slog.Handler

	// mono is the monotonic clock sessions and messages expire by; nil is
	// the process's (tests advance their own).
	mono *monoClock
}

// monoClock reads a monotonic clock (a pointer keeps Config comparable).
type monoClock struct{ now func() time.Duration }

// Option adjusts an Acquire beyond what the URL says.
type Option func(*Config)

// WithLog sends the broker's log records to h. A broker shared by several
// components logs through the handler of the one that started it.
func WithLog(h slog.Handler) Option { return func(c *Config) { c.Log = h } }

// IsEmbedded reports whether rawURL selects the embedded broker.
func IsEmbedded(rawURL string) bool {
	u, err := url.Parse(rawURL)
	return err == nil && u.Scheme == Scheme
}

// ParseURL parses and validates an `embedded://` URL.
func ParseURL(rawURL string) (Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return Config{}, fmt.Errorf("embedded broker URL %q: %w", rawURL, err)
	}
	if u.Scheme != Scheme {
		return Config{}, fmt.Errorf("embedded broker URL %q: scheme must be %q", rawURL, Scheme)
	}
	if u.Host != "" || u.User != nil || u.Opaque != "" || (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		return Config{}, fmt.Errorf("embedded broker URL %q: only query parameters are allowed after embedded:// "+
			"(e.g. embedded://?dir=./data&listen=127.0.0.1:1883); put the data directory in ?dir=", rawURL)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return Config{}, fmt.Errorf("embedded broker URL %q: bad query: %w", rawURL, err)
	}

	cfg := Config{Dir: DefaultDir, MaxInflight: defaultMaxInflight, MaxQueued: defaultMaxQueued}
	for name, values := range q {
		if len(values) != 1 {
			return Config{}, fmt.Errorf("embedded broker URL %q: parameter %q given %d times, give it once", rawURL, name, len(values))
		}
		v := values[0]
		switch name {
		case paramDir:
			if v == "" {
				return Config{}, fmt.Errorf("embedded broker URL %q: dir is empty; omit it for the default %s", rawURL, DefaultDir)
			}
			cfg.Dir = v
		case paramListen:
			if v == "" {
				return Config{}, fmt.Errorf("embedded broker URL %q: listen is empty; omit it to stay in-process", rawURL)
			}
			cfg.Listen = v
		case paramMaxInflight:
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil || n == 0 {
				return Config{}, fmt.Errorf("embedded broker URL %q: max_inflight must be an integer from 1 to 65535, got %q", rawURL, v)
			}
			cfg.MaxInflight = uint16(n)
		case paramMaxQueued:
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n <= 0 {
				return Config{}, fmt.Errorf("embedded broker URL %q: max_queued must be a positive integer, got %q", rawURL, v)
			}
			cfg.MaxQueued = int32(n)
		case paramUsers:
			cfg.Users = v
		case paramACL:
			cfg.ACL = v
		case paramTLSCert:
			cfg.TLSCert = v
		case paramTLSKey:
			cfg.TLSKey = v
		default:
			return Config{}, fmt.Errorf("embedded broker URL %q: unknown parameter %q (known: dir, listen, users, acl, tls_cert, tls_key, max_inflight, max_queued)", rawURL, name)
		}
	}
	if cfg.Listen != "" && !isLoopback(cfg.Listen) && cfg.Users == "" {
		return Config{}, fmt.Errorf("embedded broker URL %q: listen=%s accepts connections from other hosts, and without users anyone there could publish (ACKs, envelopes): add users=FILE (a mosquitto password file), or listen on 127.0.0.1", rawURL, cfg.Listen)
	}
	if (cfg.Users != "" || cfg.ACL != "" || cfg.TLSCert != "" || cfg.TLSKey != "") && cfg.Listen == "" {
		return Config{}, fmt.Errorf("embedded broker URL %q: users, acl and tls_* apply to the listen listener; add listen=HOST:PORT", rawURL)
	}
	if cfg.ACL != "" && cfg.Users == "" {
		return Config{}, fmt.Errorf("embedded broker URL %q: acl needs users: rights belong to logged-in users", rawURL)
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return Config{}, fmt.Errorf("embedded broker URL %q: give tls_cert and tls_key together", rawURL)
	}
	return cfg, nil
}

// defaultLog shows warnings and errors only: mochi reports dropped
// messages as warnings, and those must not pass silently.
func defaultLog() slog.Handler {
	return slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
}

// quietNoise is mochi's logger: it lowers to debug what needs no action,
// so the default level shows real problems such as dropped messages.
//   - mochi's own info lines (hooks added, listeners attached, server
//     starting and stopping): our "embedded broker started" line says what
//     a user needs. Our hooks log through this logger too; their lines
//     start with "embedded broker" and keep their level;
//   - the message-less listener warning logged for every client connection
//     that ends with an error (e.g. at shutdown);
//   - the low-keepalive warning when the keepalive is 0 (off on purpose) or
//     meets mochi's recommendation: mochi warns at keepalive <= 5 s while
//     naming 5 s as the value it recommends, which is our default.
type quietNoise struct{ slog.Handler }

func (h quietNoise) Handle(ctx context.Context, r slog.Record) error {
	mochiInfo := r.Level == slog.LevelInfo && !strings.HasPrefix(r.Message, "embedded broker")
	if mochiInfo || r.Level == slog.LevelWarn && (r.Message == "" || keepaliveNeedsNoAction(r)) {
		r.Level = slog.LevelDebug
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

// keepaliveNeedsNoAction reports a low-keepalive warning whose keepalive
// is 0 or at least the recommended value it names.
func keepaliveNeedsNoAction(r slog.Record) bool {
	if r.Message != mqtt.ErrMinimumKeepalive.Error() {
		return false
	}
	keepalive, recommended := int64(-1), int64(-1)
	r.Attrs(func(a slog.Attr) bool {
		v, err := strconv.ParseInt(a.Value.Resolve().String(), 10, 64)
		switch {
		case err != nil:
		case a.Key == "keepalive":
			keepalive = v
		case a.Key == "recommended":
			recommended = v
		}
		return true
	})
	return keepalive == 0 || keepalive > 0 && recommended > 0 && keepalive >= recommended
}

func (h quietNoise) WithAttrs(as []slog.Attr) slog.Handler {
	return quietNoise{h.Handler.WithAttrs(as)}
}

func (h quietNoise) WithGroup(name string) slog.Handler {
	return quietNoise{h.Handler.WithGroup(name)}
}

// brokers holds the running brokers keyed by absolute data directory. An
// entry exists exactly while a Broker handle uses it; the bbolt file of a
// directory is therefore opened at most once per process.
var brokers registry.Registry[*instance]

// instance is one running broker shared by every Broker handle on its dir.
type instance struct {
	dir       string
	cfg       Config
	server    *mqtt.Server
	store     *storeHook
	clientURL string
	listens   map[string]bool // extra listener addresses already open
	tls       *tls.Config     // of the listen listeners; nil = plain TCP
}

// Broker is one caller's reference to a shared embedded broker.
type Broker struct {
	inst     *instance
	released sync.Once
}

// Acquire starts (or joins) the broker for the URL's data directory and
// returns a reference to it. Every successful Acquire must be paired with
// one Release.
func Acquire(rawURL string, opts ...Option) (*Broker, error) {
	cfg, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	for _, o := range opts {
		o(&cfg)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("embedded broker: resolve data directory %q: %w", cfg.Dir, err)
	}
	// Two spellings of one directory (a symlink) must name one broker, or
	// the second would wait on the first one's file lock.
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}

	join := func(inst *instance) error { return inst.join(cfg) }
	inst, err := brokers.Acquire(dir, join, func() (*instance, error) { return start(dir, cfg) })
	if err != nil {
		return nil, err
	}
	return &Broker{inst: inst}, nil
}

// ClientURL is the address in-process clients dial, e.g. tcp://127.0.0.1:41234.
func (b *Broker) ClientURL() string { return b.inst.clientURL }

// Dir is the broker's absolute data directory.
func (b *Broker) Dir() string { return b.inst.dir }

// Release drops this reference. The last Release closes the broker and its
// store, waiting at most closeTimeout. Calling Release again is a no-op.
func (b *Broker) Release() error {
	var err error
	b.released.Do(func() {
		// Closed under the registry's lock: a new broker on the directory
		// must not open its file while this one still holds it.
		err = brokers.ReleaseClose(b.inst.dir, b.inst, (*instance).close)
	})
	return err
}

// join checks that a later URL for a running broker agrees with it, and
// opens its extra listener if it asks for a new one.
func (inst *instance) join(cfg Config) error {
	if cfg.MaxInflight != inst.cfg.MaxInflight || cfg.MaxQueued != inst.cfg.MaxQueued {
		return fmt.Errorf("embedded broker for %s already runs with max_inflight=%d max_queued=%d; "+
			"every embedded:// URL naming this dir must use the same limits (got max_inflight=%d max_queued=%d)",
			inst.dir, inst.cfg.MaxInflight, inst.cfg.MaxQueued, cfg.MaxInflight, cfg.MaxQueued)
	}
	if cfg.Listen == "" || inst.listens[cfg.Listen] {
		return nil
	}
	if cfg.Users != inst.cfg.Users || cfg.ACL != inst.cfg.ACL || cfg.TLSCert != inst.cfg.TLSCert || cfg.TLSKey != inst.cfg.TLSKey {
		return fmt.Errorf("embedded broker for %s already runs with users=%q acl=%q tls_cert=%q; a second listen on it must use the same", inst.dir, inst.cfg.Users, inst.cfg.ACL, inst.cfg.TLSCert)
	}
	id := "listen-" + strconv.Itoa(len(inst.listens)+1)
	if err := inst.server.AddListener(listeners.NewTCP(listeners.Config{ID: id, Address: cfg.Listen, TLSConfig: inst.tls})); err != nil {
		return fmt.Errorf("embedded broker for %s: listen on %s: %w (is the port in use?)", inst.dir, cfg.Listen, err)
	}
	inst.server.Listeners.Serve(id, inst.server.EstablishConnection)
	inst.listens[cfg.Listen] = true
	return nil
}

// start opens the store, restores it into a new mochi server and serves.
func start(dir string, cfg Config) (*instance, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded broker: create data directory %s: %w", dir, err)
	}
	h := cfg.Log
	if h == nil {
		h = defaultLog()
	}
	log := slog.New(h).With("component", "embedded_broker", "dir", dir)

	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumInflight = cfg.MaxInflight
	caps.MaximumClientWritesPending = cfg.MaxQueued
	caps.ReceiveMaximum = math.MaxUint16
	// mochi drops queued and retained messages older than this (default one
	// day); an edge device may stay offline longer, so only a message's own
	// expiry interval applies.
	caps.MaximumMessageExpiryInterval = 0
	// Sessions never expire on mochi's wall clock: expiryHook expires
	// them on observed time (and this is the interval of MQTT 3 sessions).
	caps.MaximumSessionExpiryInterval = neverExpires

	server := mqtt.New(&mqtt.Options{
		Capabilities: caps,
		Logger:       slog.New(quietNoise{h}).With("component", "embedded_broker", "dir", dir),
		InlineClient: true, // used to replay fan-outs interrupted by a crash
	})

	store := &storeHook{server: server}
	expiry := newExpiryHook(server, store, cfg.mono)
	store.expiry = expiry
	inst := &instance{dir: dir, cfg: cfg, server: server, store: store, listens: map[string]bool{}}
	fail := func(err error) (*instance, error) {
		_ = closeBounded(server) // also stops the hooks, closing the store if it opened
		return nil, err
	}

	// The private listener is loopback-only and serves this process; the
	// listen listener gets the users, ACL and TLS of the URL.
	access := &accessHook{private: privateListener}
	var err error
	if cfg.Users != "" {
		if access.users, err = loadUsers(cfg.Users); err != nil {
			return fail(fmt.Errorf("embedded broker for %s: %w", dir, err))
		}
	}
	if cfg.ACL != "" {
		if access.acls, err = loadACL(cfg.ACL); err != nil {
			return fail(fmt.Errorf("embedded broker for %s: %w", dir, err))
		}
	}
	if cfg.TLSCert != "" {
		if inst.tls, err = loadTLS(cfg.TLSCert, cfg.TLSKey); err != nil {
			return fail(fmt.Errorf("embedded broker for %s: %w", dir, err))
		}
	}
	if err := server.AddHook(new(receiveMaxHook), nil); err != nil {
		return fail(fmt.Errorf("embedded broker for %s: add receive-maximum hook: %w", dir, err))
	}
	if err := server.AddHook(access, nil); err != nil {
		return fail(fmt.Errorf("embedded broker for %s: add access hook: %w", dir, err))
	}
	if err := server.AddHook(expiry, nil); err != nil { // before the store: it rewrites what the store's hooks read
		return fail(fmt.Errorf("embedded broker for %s: add expiry hook: %w", dir, err))
	}
	if err := server.AddHook(store, filepath.Join(dir, storeFile)); err != nil {
		return fail(err)
	}

	private := listeners.NewTCP(listeners.Config{ID: privateListener, Address: "127.0.0.1:0"})
	if err := server.AddListener(private); err != nil {
		return fail(fmt.Errorf("embedded broker for %s: open private listener on 127.0.0.1: %w", dir, err))
	}
	inst.clientURL = "tcp://" + private.Address()

	if cfg.Listen != "" {
		if err := server.AddListener(listeners.NewTCP(listeners.Config{ID: "listen", Address: cfg.Listen, TLSConfig: inst.tls})); err != nil {
			return fail(fmt.Errorf("embedded broker for %s: listen on %s: %w (is the port in use?)", dir, cfg.Listen, err))
		}
		inst.listens[cfg.Listen] = true
	}

	if err := server.Serve(); err != nil {
		return fail(fmt.Errorf("embedded broker for %s: start: %w", dir, err))
	}
	if err := store.replayFanouts(server); err != nil {
		return fail(err)
	}
	log.Info("embedded broker started", "client_url", inst.clientURL, "listen", cfg.Listen)
	return inst, nil
}

func (inst *instance) close() error {
	if err := closeBounded(inst.server); err != nil {
		return fmt.Errorf("embedded broker for %s: %w", inst.dir, err)
	}
	return inst.store.closeErr()
}

// closeBounded closes a mochi server (listeners, clients, then hooks, which
// closes the store), giving up after closeTimeout.
func closeBounded(server *mqtt.Server) error {
	if !shutdown.Wait(closeTimeout, shutdown.Go(func() { _ = server.Close() })) {
		return errors.New("close did not finish within " + closeTimeout.String() +
			"; a client connection is stuck, the data file may stay locked until the process exits")
	}
	return nil
}
