package mqttout

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/benthoslog"
	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sender"
	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
	"github.com/reliable-mqtt/reliable-mqtt/internal/tracing"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/mqttconf"
)

// closeTimeout bounds Close: Benthos hands Close a context without deadline.
const closeTimeout = shutdown.Send

// maxMQTTPayload is the largest payload an MQTT 3.1.1 PUBLISH can carry
// (the remaining-length limit less a maximal topic and packet ID).
const maxMQTTPayload = 268435455 - 2 - 65535 - 2

type output struct {
	s   settings
	log *service.Logger
	m   *metrics
	// spans are the records' trace spans; nil with the tracer off.
	spans *tracing.Deliveries

	mu      sync.Mutex
	ob      *outbox.Outbox // nil in direct mode
	client  mqttclient.Transport
	acks    *sender.AckQueue
	ignored *sender.IgnoredACKs
	sender  *sender.Sender // outbox mode
	direct  *sender.Direct // direct mode
	stop    context.CancelFunc
	closed  bool
}

// newOutput parses the config and opens the outbox: a path that can never
// work (a directory, an unwritable directory, a foreign or damaged file, a
// file another process holds) fails the constructor, which stops Benthos at
// start with the message, instead of a Connect that is retried forever.
func newOutput(conf *service.ParsedConfig, mgr *service.Resources) (*output, error) {
	s, err := parseSettings(conf)
	if err != nil {
		return nil, err
	}
	o := &output{s: s, log: mgr.Logger(), m: newMetrics(mgr.Metrics()), spans: tracing.NewDeliveries(mgr.OtelTracer(), hopName(mgr))}
	if s.outboxOn {
		opts := s.outboxOpts
		opts.SameProps = tracing.SameProps
		if s.traceEnvelope {
			opts.SamePayload = codec.SamePayload // the envelopes carry a trace context
		}
		opts.OnDamaged = func(d outbox.DamagedRecord) { o.log.Errorf("%v", d) }
		if o.ob, err = openOutbox(s.outboxPath, opts); err != nil {
			return nil, err
		}
		o.ob.ReportStart(o.log)
	}
	return o, nil
}

func openOutbox(path string, opts outbox.Options) (*outbox.Outbox, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating the directory of outbox %s: %w", path, err)
	}
	return outbox.Open(path, opts)
}

// Connect starts connecting to the broker in the background. With an
// outbox it returns at once: writes are accepted while the broker is away,
// so the output is ready while its outbox is open, and the link shows in
// reliable_mqtt_out_connected. In direct mode a write needs the broker, so
// Connect waits (bounded) for a connection and fails without one: Benthos
// marks the output not ready and calls Connect again.
func (o *output) Connect(ctx context.Context) error {
	o.mu.Lock()
	err := o.start()
	client, direct := o.client, o.ob == nil
	o.mu.Unlock()
	if err != nil || !direct {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.s.client.ConnectTimeout+time.Second)
	defer cancel()
	if _, err := client.WaitReady(ctx); err != nil {
		return fmt.Errorf("no MQTT connection to %v yet (still trying in the background): %w", o.s.client.URLs, err)
	}
	return nil
}

// start starts the client, the sender and the gauges' watchers once.
// Caller holds mu.
func (o *output) start() error {
	if o.client != nil {
		return nil
	}
	if o.closed {
		return service.ErrNotConnected
	}
	cfg := o.s.client
	if o.ob != nil && cfg.ClientID == "" {
		var err error
		if cfg.ClientID, err = o.ob.ClientID(); err != nil {
			return err
		}
	}
	// A stable client ID names a session worth keeping: ACKs that arrive
	// while we are disconnected wait for us at the broker.
	cfg.CleanSession = cfg.ClientID == ""
	if cfg.ClientID == "" {
		cfg.ClientID = "reliable-mqtt-" + envelope.NewRandomID()[:16]
	}

	o.acks = sender.NewAckQueue()
	o.ignored = sender.NewIgnoredACKs(o.m, o.log)
	handlers := mqttclient.Handlers{}
	if o.s.endToEnd {
		retainedWarn := &benthoslog.Every{Interval: 10 * time.Second}
		handlers = sender.AckHandlers(o.s.ackTopic, o.s.ackAuthKeys, o.acks, o.ignored, o.log, retainedWarn.Allow)
	}
	client, err := mqttconf.ClientStarter(o.log, false)(cfg, handlers)
	if err != nil {
		return err
	}
	o.client = client

	runCtx, cancel := context.WithCancel(context.Background())
	o.stop = cancel
	if o.ob != nil {
		o.sender = sender.New(o.s.senderConfig(), o.ob, client, o.acks, o.ignored, o.senderMetrics(), o.log)
		go o.sender.Run(runCtx)
		go o.m.watchOutbox(runCtx, o.ob, o.log, o.s.statsInterval)
	} else {
		o.direct = sender.NewDirect(o.s.senderConfig(), client, o.acks, o.ignored, o.m)
		go o.direct.Run(runCtx)
		// The outbox sender sets the gauge itself; here nothing else would.
		go mqttclient.WatchLink(runCtx, client, o.m.SetConnected)
	}
	return nil
}

// WriteBatch stores (outbox mode) or publishes and confirms (direct mode)
// every message of batch. A message that fails is reported alone in a
// service.BatchError, so only it is retried; the others are done.
func (o *output) WriteBatch(ctx context.Context, batch service.MessageBatch) error {
	o.mu.Lock()
	ob, d := o.ob, o.direct
	if o.client == nil {
		ob, d = nil, nil
	}
	o.mu.Unlock()
	if ob == nil && d == nil {
		return service.ErrNotConnected
	}
	errs := make([]error, len(batch))
	recs := make([]mqttmsg.Event, len(batch))
	for i, msg := range batch {
		if err := msg.GetError(); err != nil {
			// A processor failed this message (a malformed envelope, a ledger
			// that could not check it): publishing it would pass it on as valid.
			errs[i] = fmt.Errorf("refusing a message flagged with an error (route it with a switch on errored() or reject_errored): %w", err)
			continue
		}
		recs[i], errs[i] = o.buildRecord(msg)
		o.traceStart(msg, &recs[i], errs[i])
	}
	if d != nil {
		if o.notConnected(errs, false) {
			return service.ErrNotConnected
		}
		d.SendAll(ctx, recs, errs)
		o.traceWritten(recs, errs, true)
		if o.notConnected(errs, true) {
			return service.ErrNotConnected
		}
	} else {
		o.appendAll(ctx, ob, batch, recs, errs)
		o.traceWritten(recs, errs, false)
	}
	return batchError(batch, errs)
}

// notConnected reports, in direct mode, that the broker connection is down
// and no message of the batch is settled: none succeeded (sent: a nil error
// is a success) and none failed permanently. Returning
// service.ErrNotConnected then makes Benthos mark the output not ready and
// hold the batch until Connect succeeds again.
func (o *output) notConnected(errs []error, sent bool) bool {
	o.mu.Lock()
	client := o.client
	o.mu.Unlock()
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

// appendAll appends the messages that have a record in one AppendBatch: they
// share the committer's transactions.
func (o *output) appendAll(ctx context.Context, ob *outbox.Outbox, batch service.MessageBatch, recs []mqttmsg.Event, errs []error) {
	entries := make([]outbox.Entry, len(batch))
	for i, rec := range recs {
		if errs[i] != nil {
			continue
		}
		// A participant that finds the event already applied returns
		// commit.ErrAlreadyApplied: nothing is appended.
		entries[i] = outbox.Entry{Event: rec, Participants: commit.ParticipantsFor(batch[i].Context(), ob.Path())}
	}
	ob.AppendEach(ctx, entries, errs)
}

// batchError is nil when every message succeeded, the error itself for a
// batch of one, and otherwise a BatchError naming each failed message.
func batchError(batch service.MessageBatch, errs []error) error {
	var failed *service.BatchError
	for i, err := range errs {
		if err == nil {
			continue
		}
		if len(batch) == 1 {
			return err
		}
		if failed == nil {
			failed = service.NewBatchError(batch, fmt.Errorf("%d of %d messages failed, first: %w", countErrs(errs), len(batch), err))
		}
		failed.Failed(i, err)
	}
	if failed == nil {
		return nil
	}
	return failed
}

func countErrs(errs []error) (n int) {
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	return n
}

// Close stops the sender and disconnects. Records still in flight stay in
// the outbox for the next start.
func (o *output) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, closeTimeout)
	defer cancel()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	if o.stop != nil {
		o.stop()
	}
	var errs []error
	if o.sender != nil {
		if err := o.sender.Wait(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if o.direct != nil {
		o.direct.Wait(ctx)
	}
	if o.client != nil {
		if err := o.client.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if o.ob != nil {
		if err := o.ob.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	o.spans.Close()
	o.ob, o.client, o.sender, o.direct, o.stop = nil, nil, nil, nil, nil
	return errors.Join(errs...)
}

// hopName names this output in its spans: its label, or its type.
func hopName(mgr *service.Resources) string {
	if l := mgr.Label(); l != "" {
		return l
	}
	return "reliable_mqtt_out"
}
