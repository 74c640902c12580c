package sender

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
)

// Write's errors when nothing is settled (direct mode: the broker is away);
// the caller holds the batch until the connection is back.
var (
	// ErrNotStarted: before Start, after Close, or (direct mode) with no
	// connection before anything was sent.
	ErrNotStarted = errors.New("the output is not started or not connected")
	// ErrDisconnected: direct mode, sent, and the connection was lost with
	// no event confirmed; the outcomes are in errs.
	ErrDisconnected = errors.New("the connection was lost before any event was confirmed")
)

// Options are everything the write path needs, as the plugin parsed it.
type Options struct {
	Config
	// Client is the connection; an empty ClientID is the outbox's stored
	// one, or (direct mode) a random one with a clean session.
	Client mqttclient.Config
	// Start starts the client (and the brokers beside it).
	Start mqttclient.Starter
	// OutboxPath is the outbox file; "" is direct mode.
	OutboxPath string
	Outbox     outbox.Options
	Metrics    Metrics
	Log        Logger
}

// Output is the one owner of reliable_mqtt_out's write path: it encodes
// events, keeps them in the outbox (or, in direct mode, publishes each and
// waits for it), starts the client, and confirms as Config.Confirm says.
// The plugin hands it events and reads its metrics; it never names a
// Benthos type.
type Output struct {
	o  Options
	ob *outbox.Outbox // nil in direct mode

	mu      sync.Mutex
	client  mqttclient.Transport
	sender  *Sender // outbox mode
	direct  *Direct // direct mode
	stop    context.CancelFunc
	started bool
	closed  bool
}

// NewOutput opens the outbox, when there is one: a path that can never work
// (a directory, an unwritable directory, a foreign or damaged file, a file
// another process holds) fails here, at start, not at every connect.
func NewOutput(o Options) (*Output, error) {
	out := &Output{o: o}
	if o.OutboxPath == "" {
		return out, nil
	}
	if err := os.MkdirAll(filepath.Dir(o.OutboxPath), 0o755); err != nil {
		return nil, fmt.Errorf("creating the directory of outbox %s: %w", o.OutboxPath, err)
	}
	if o.Encoding.TraceContext {
		o.Outbox.SamePayload = codec.SamePayload // the envelopes carry a trace context
	}
	ob, err := outbox.Open(o.OutboxPath, o.Outbox)
	if err != nil {
		return nil, err
	}
	ob.ReportStart(o.Log)
	out.ob = ob
	return out, nil
}

// Outbox is the outbox, nil in direct mode (for the plugin's gauges).
func (out *Output) Outbox() *outbox.Outbox { return out.ob }

// Encoding is how events are encoded (the plugin adds trace contexts).
func (out *Output) Encoding() codec.Encoding { return out.o.Encoding }

// Encode builds the event of id for topic from the payload raw, the MQTT 5
// properties extra and the retain flag, and refuses one beyond
// max_payload_bytes. Each error is permanent to the caller: the same
// message fails the same way every time.
func (out *Output) Encode(id, topic string, raw []byte, extra *mqttmsg.Properties, retained bool) (mqttmsg.Event, error) {
	ev, err := out.o.Encoding.Encode(id, topic, raw, extra)
	if err != nil {
		return ev, err
	}
	ev.Retained = retained
	return ev, out.o.Encoding.CheckSize(ev, topic)
}

// Start starts the client and the sender (or direct mode) once, in the
// background: it does not wait for a broker.
func (out *Output) Start() error {
	out.mu.Lock()
	defer out.mu.Unlock()
	if out.closed {
		return ErrNotStarted
	}
	if out.started {
		return nil
	}
	cfg := out.o.Client
	if out.ob != nil && cfg.ClientID == "" {
		var err error
		if cfg.ClientID, err = out.ob.ClientID(); err != nil {
			return err
		}
	}
	// A stable client ID names a session worth keeping: ACKs that arrive
	// while we are disconnected wait for us at the broker.
	cfg.CleanSession = cfg.ClientID == ""
	if cfg.ClientID == "" {
		cfg.ClientID = "reliable-mqtt-" + envelope.NewRandomID()[:16]
	}

	acks := NewAckQueue()
	ignored := NewIgnoredACKs(out.o.Metrics, out.o.Log)
	client, err := out.o.Start(cfg, out.o.confirm().handlers(acks, ignored, out.o.Log))
	if err != nil {
		return err
	}
	out.client = client

	runCtx, cancel := context.WithCancel(context.Background())
	out.stop = cancel
	if out.ob != nil {
		out.sender = New(out.o.Config, out.ob, client, acks, ignored, out.o.Metrics, out.o.Log)
		go out.sender.Run(runCtx)
	} else {
		out.direct = NewDirect(out.o.Config, client, acks, ignored, out.o.Metrics)
		go out.direct.Run(runCtx)
		// The outbox sender sets the gauge itself; here nothing else would.
		go mqttclient.WatchLink(runCtx, client, out.o.Metrics.SetConnected)
	}
	out.started = true
	return nil
}

// WaitReady waits, bounded by ctx, for a ready connection: in direct mode
// a write needs one. With an outbox it returns at once (writes are
// accepted while the broker is away).
func (out *Output) WaitReady(ctx context.Context) error {
	out.mu.Lock()
	client := out.client
	out.mu.Unlock()
	if out.ob != nil {
		return nil
	}
	if client == nil {
		return ErrNotStarted
	}
	_, err := client.WaitReady(ctx)
	return err
}

// Write stores (outbox mode) or publishes and confirms (direct mode) the
// events whose errs entry is nil, and sets each outcome in errs. msgCtxs
// are the messages' contexts: the transaction participants they carry
// (commit.ParticipantsFor) commit with the append. In direct mode it
// reports ErrNotStarted or ErrDisconnected while no event is settled and
// the broker is away.
func (out *Output) Write(ctx context.Context, evs []mqttmsg.Event, msgCtxs []context.Context, errs []error) error {
	out.mu.Lock()
	ob, d, started := out.ob, out.direct, out.started && !out.closed
	out.mu.Unlock()
	if !started {
		return ErrNotStarted
	}
	if d == nil {
		entries := make([]outbox.Entry, len(evs))
		for i, ev := range evs {
			if errs[i] == nil {
				// A participant that finds the event already applied returns
				// commit.ErrAlreadyApplied: nothing is appended.
				entries[i] = outbox.Entry{Event: ev, Participants: commit.ParticipantsFor(msgCtxs[i], ob.Path())}
			}
		}
		ob.AppendEach(ctx, entries, errs)
		return nil
	}
	if out.notConnected(errs, false) {
		return ErrNotStarted
	}
	d.SendAll(ctx, evs, errs)
	if out.notConnected(errs, true) {
		return ErrDisconnected
	}
	return nil
}

// notConnected reports, in direct mode, that the broker connection is down
// and no event is settled: none succeeded (sent: a nil error is a success)
// and none failed permanently. The plugin then holds the batch until the
// connection is back.
func (out *Output) notConnected(errs []error, sent bool) bool {
	out.mu.Lock()
	client := out.client
	out.mu.Unlock()
	if client == nil || client.Current() != nil {
		return false
	}
	for _, err := range errs {
		if (sent && err == nil) || codec.IsPermanent(err) {
			return false
		}
	}
	return true
}

// Close stops the sender and disconnects, bounded by ctx. Records still in
// flight stay in the outbox for the next start.
func (out *Output) Close(ctx context.Context) error {
	out.mu.Lock()
	defer out.mu.Unlock()
	out.closed = true
	if out.stop != nil {
		out.stop()
	}
	var errs []error
	if out.sender != nil {
		if err := out.sender.Wait(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if out.direct != nil {
		out.direct.Wait(ctx)
	}
	if out.client != nil {
		if err := out.client.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if out.ob != nil {
		if err := out.ob.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	out.ob, out.client, out.sender, out.direct, out.stop = nil, nil, nil, nil, nil
	return errors.Join(errs...)
}

// ConnectTimeout bounds a wait for the first connection.
func (out *Output) ConnectTimeout() time.Duration { return out.o.Client.ConnectTimeout + time.Second }
