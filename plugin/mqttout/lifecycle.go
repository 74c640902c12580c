package mqttout

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redpanda-data/benthos/v4/public/service"

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
	out   *sender.Output

	watching sync.Once
	stopMu   sync.Mutex
	stop     context.CancelFunc // ends the outbox gauges' watcher
}

// newOutput parses the config and opens the write path: an outbox path
// that can never work fails the constructor, which stops Benthos at start
// with the message, instead of a Connect that is retried forever.
func newOutput(conf *service.ParsedConfig, mgr *service.Resources) (*output, error) {
	s, err := parseSettings(conf)
	if err != nil {
		return nil, err
	}
	o := &output{s: s, log: mgr.Logger(), m: newMetrics(mgr.Metrics()), spans: tracing.NewDeliveries(mgr.OtelTracer(), hopName(mgr))}
	opts := s.sender
	opts.Start = mqttconf.ClientStarter(o.log, false)
	opts.Metrics, opts.Log = o.senderMetrics(), o.log
	opts.Outbox.SameProps = tracing.SameProps
	opts.Outbox.OnDamaged = func(d outbox.DamagedRecord) { o.log.Errorf("%v", d) }
	if o.out, err = sender.NewOutput(opts); err != nil {
		return nil, err
	}
	return o, nil
}

// Connect starts connecting to the broker in the background. With an
// outbox it returns at once: writes are accepted while the broker is away,
// so the output is ready while its outbox is open, and the link shows in
// reliable_mqtt_out_connected. In direct mode a write needs the broker, so
// Connect waits (bounded) for a connection and fails without one: Benthos
// marks the output not ready and calls Connect again.
func (o *output) Connect(ctx context.Context) error {
	if err := o.out.Start(); err != nil {
		if errors.Is(err, sender.ErrNotStarted) {
			return service.ErrNotConnected
		}
		return err
	}
	if ob := o.out.Outbox(); ob != nil {
		o.watching.Do(func() {
			runCtx, cancel := context.WithCancel(context.Background())
			o.stopMu.Lock()
			o.stop = cancel
			o.stopMu.Unlock()
			o.m.watchOutbox(runCtx, ob, o.log, o.s.statsInterval)
		})
	}
	ctx, cancel := context.WithTimeout(ctx, o.out.ConnectTimeout())
	defer cancel()
	if err := o.out.WaitReady(ctx); err != nil {
		return fmt.Errorf("no MQTT connection to %v yet (still trying in the background): %w", o.s.sender.Client.URLs, err)
	}
	return nil
}

// WriteBatch stores (outbox mode) or publishes and confirms (direct mode)
// every message of batch. A message that fails is reported alone in a
// service.BatchError, so only it is retried; the others are done.
func (o *output) WriteBatch(ctx context.Context, batch service.MessageBatch) error {
	errs := make([]error, len(batch))
	recs := make([]mqttmsg.Event, len(batch))
	ctxs := make([]context.Context, len(batch))
	for i, msg := range batch {
		ctxs[i] = msg.Context()
		if err := msg.GetError(); err != nil {
			// A processor failed this message (a malformed envelope, a ledger
			// that could not check it): publishing it would pass it on as valid.
			errs[i] = fmt.Errorf("refusing a message flagged with an error (route it with a switch on errored() or reject_errored): %w", err)
			continue
		}
		recs[i], errs[i] = o.buildRecord(msg)
		o.traceStart(msg, &recs[i], errs[i])
	}
	switch err := o.out.Write(ctx, recs, ctxs, errs); {
	case errors.Is(err, sender.ErrDisconnected):
		o.traceWritten(recs, errs, true)
		return service.ErrNotConnected
	case err != nil:
		return service.ErrNotConnected
	}
	o.traceWritten(recs, errs, o.out.Outbox() == nil)
	return batchError(batch, errs)
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

// Close stops the write path and disconnects. Records still in flight
// stay in the outbox for the next start.
func (o *output) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, closeTimeout)
	defer cancel()
	o.stopMu.Lock()
	if o.stop != nil {
		o.stop()
	}
	o.stopMu.Unlock()
	err := o.out.Close(ctx)
	o.spans.Close()
	return err
}

// hopName names this output in its spans: its label, or its type.
func hopName(mgr *service.Resources) string {
	if l := mgr.Label(); l != "" {
		return l
	}
	return "reliable_mqtt_out"
}
