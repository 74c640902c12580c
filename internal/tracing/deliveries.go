package tracing

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// scope names our spans' instrumentation in a trace.
const scope = "github.com/reliable-mqtt/reliable-mqtt"

// maxOpen bounds the spans a sending hop keeps open: beyond it a new
// record's span is closed at once (outcome "untracked"), so a long outage
// with a large outbox cannot hold unbounded memory in spans.
const maxOpen = 100_000

// Deliveries are the open spans of a sending hop, one per record from its
// write until its confirmation, by event ID. A span's duration is the
// record's end-to-end confirmation latency; its events are the outbox
// append and each publish. Spans of records written before a restart are
// not reopened: their stored traceparent still joins the receivers' spans
// to the original trace.
type Deliveries struct {
	tracer trace.Tracer
	hop    string
	now    func() time.Time

	mu   sync.Mutex
	open map[string]*delivery
}

type delivery struct {
	span     trace.Span
	written  time.Time
	attempts int
	dead     string // the reason it is a dead letter; "" for an ordinary record
}

// NewDeliveries returns the span tracker of the sending hop named hop; nil
// when tp records nothing (every method of a nil *Deliveries is a no-op).
func NewDeliveries(tp trace.TracerProvider, hop string) *Deliveries {
	if !On(tp) {
		return nil
	}
	return &Deliveries{tracer: tp.Tracer(scope), hop: hop, now: time.Now, open: map[string]*delivery{}}
}

// Start opens the span of a record about to be written for eventID to
// topic, a child of the span in ctx (the message's), and returns the new
// span's context, whose trace context the record carries (ContextOf). It
// returns nil when it opened no span: the tracer is off, or a second write
// of an event whose span is still open keeps the first span (the outbox
// keeps the first record).
func (d *Deliveries) Start(ctx context.Context, eventID, topic string) context.Context {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, dup := d.open[eventID]; dup {
		return nil
	}
	now := d.now()
	ctx, span := d.tracer.Start(ctx, "deliver "+topic, trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(now),
		trace.WithAttributes(AttrEventID.String(eventID), AttrTopic.String(topic), AttrHop.String(d.hop)))
	if len(d.open) >= maxOpen {
		end(span, "untracked", nil)
	} else {
		d.open[eventID] = &delivery{span: span, written: now}
	}
	return ctx
}

// update runs f on eventID's open span, under the lock; nothing when
// tracing is off or the span is closed (or was never opened here).
func (d *Deliveries) update(eventID string, f func(*delivery)) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if dl, ok := d.open[eventID]; ok {
		f(dl)
	}
}

// Stored marks eventID durable in the outbox (its write returned).
func (d *Deliveries) Stored(eventID string) {
	d.update(eventID, func(dl *delivery) { dl.span.AddEvent("stored in the outbox") })
}

// OnEventPublished records a publish of eventID: the first one sets the
// outbox wait (from the write to the first publish), a later one marks
// the record retried.
func (d *Deliveries) OnEventPublished(eventID string) {
	d.update(eventID, func(dl *delivery) {
		dl.attempts++
		if dl.attempts > 1 {
			dl.span.AddEvent("published again (" + Retried + ")")
			return
		}
		dl.span.SetAttributes(AttrOutboxWait.Int64(d.now().Sub(dl.written).Milliseconds()))
		dl.span.AddEvent("published")
	})
}

// OnEventConfirmed closes eventID's span: its PUBACK or end-to-end ACK
// arrived.
func (d *Deliveries) OnEventConfirmed(eventID string) { d.Done(eventID, nil) }

// Done closes eventID's span: confirmed when err is nil, else refused
// (a permanent failure) or retried (upstream delivers it again).
func (d *Deliveries) Done(eventID string, err error) {
	if d == nil {
		return
	}
	d.mu.Lock()
	dl, ok := d.open[eventID]
	delete(d.open, eventID)
	d.mu.Unlock()
	if !ok {
		return
	}
	dl.span.SetAttributes(AttrAttempts.Int(dl.attempts))
	switch {
	case err == nil && dl.dead != "":
		dl.span.SetAttributes(AttrReason.String(dl.dead))
		end(dl.span, DeadLettered, nil)
		return
	case err == nil:
		end(dl.span, Confirmed, nil)
		return
	}
	end(dl.span, outcomeOf(err), err)
}

// DeadLetter marks eventID's record a dead letter written for reason (the
// error that made the message one): confirmed, its outcome is
// dead-lettered.
func (d *Deliveries) DeadLetter(eventID, reason string) {
	if reason != "" {
		d.update(eventID, func(dl *delivery) { dl.dead = reason })
	}
}

// Refused records, as a span of its own below the message's span in ctx,
// a message the output refused before it became a record (err says why:
// too large, an invalid topic or event ID).
func (d *Deliveries) Refused(ctx context.Context, err error) {
	if d == nil {
		return
	}
	_, span := d.tracer.Start(ctx, "refuse", trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(AttrHop.String(d.hop)))
	end(span, outcomeOf(err), err)
}

// Close ends every open span (the records stay in the outbox and are sent
// after the next start, without a span of this process).
func (d *Deliveries) Close() {
	if d == nil {
		return
	}
	d.mu.Lock()
	open := d.open
	d.open = map[string]*delivery{}
	d.mu.Unlock()
	for _, dl := range open {
		dl.span.SetAttributes(AttrAttempts.Int(dl.attempts))
		end(dl.span, PendingAtClose, nil)
	}
}

// outcomeOf names a failure: refused when it says the message can never be
// published (codec.PermanentPrefix), else retried.
func outcomeOf(err error) string {
	if strings.Contains(err.Error(), "permanent failure: ") {
		return Refused
	}
	return Retried
}

// SameProps reports whether two writes' properties are one record's, apart
// from their trace context (outbox.Options.SameProps).
func SameProps(stored, written *mqttmsg.Properties) bool {
	a, b := WithoutContext(stored), WithoutContext(written)
	if a == nil || b == nil {
		return empty(a) && empty(b)
	}
	return slices.Equal(a.User, b.User) && a.ContentType == b.ContentType && a.ResponseTopic == b.ResponseTopic &&
		bytes.Equal(a.CorrelationData, b.CorrelationData) && a.MessageExpiry == b.MessageExpiry
}

// empty reports whether p carries no property at all.
func empty(p *mqttmsg.Properties) bool {
	return p == nil || (len(p.User) == 0 && p.ContentType == "" && p.ResponseTopic == "" && len(p.CorrelationData) == 0 && p.MessageExpiry == 0)
}
