// Package sender is the engine of reliable_mqtt_out and the one owner of
// its write path (Output): it starts the client, encodes events, keeps
// them in the outbox or publishes them directly, matches their
// confirmations (a Confirmation chosen once: PUBACK, or an end-to-end ACK
// with the record's event ID) and, with an outbox, removes what is
// confirmed and resends the rest from the oldest. It knows nothing of
// Benthos: the plugin hands it Options, a Logger and Metrics.
package sender

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
)

// Config is what the sender needs of the output's configuration.
type Config struct {
	Window         int            // records in flight at most (outbox mode); the sizer picks how many below it
	PublishTimeout time.Duration  // wait for a PUBACK (and, direct mode, for a connection)
	Confirm        Confirmation   // what confirms a record; nil: ByPuback
	Retained       bool           // the retain flag of outbox records
	Encoding       codec.Encoding // how records are encoded (what a frame unpacks them from)
	Pack           Pack           // records per PUBLISH (outbox mode)
	Retry          backoff.Backoff
	// RequireSubscribers sets Publication.RequireSubscribers: on MQTT 5 a
	// PUBACK 0x10 (no matching subscribers) fails the publish, so the
	// record stays and is resent after the retry backoff.
	RequireSubscribers bool
}

// Logger is what the sender logs through (Benthos's *service.Logger fits).
type Logger interface {
	Infof(format string, args ...any)
	Warnf(format string, args ...any)
	Errorf(format string, args ...any)
}

// Metrics is what the sender reports.
type Metrics interface {
	OnPublished()
	OnConfirmed(latency time.Duration)
	OnRetried()
	SetConnected(bool)
	// SetWindow reports the records a session may keep unconfirmed now
	// (the sizer's limit, within the server's Receive Maximum).
	SetWindow(n int)
	// OnIgnoredACK counts an ACK that confirmed nothing, by reason.
	OnIgnoredACK(reason string)
	// OnReasonCode counts an MQTT 5 PUBACK reason code that failed a
	// publish (0x80 or more; 0x10 with RequireSubscribers).
	OnReasonCode(code byte)
}

// EventObserver, when the Metrics implement it too, hears of each record by
// event ID (a tracer closes the record's span at its confirmation).
type EventObserver interface {
	OnEventPublished(eventID string)
	OnEventConfirmed(eventID string)
}

// noEvents is the EventObserver of Metrics that are not one.
type noEvents struct{}

func (noEvents) OnEventPublished(string) {}
func (noEvents) OnEventConfirmed(string) {}

// Sender publishes the outbox oldest first and removes what is confirmed.
//
// Invariants, enforced here:
//   - a record is removed only after its confirmation (PUBACK for broker,
//     an ACK with its event ID for end_to_end); no failure removes anything;
//   - records are published in FIFO order, at most Window unconfirmed at a
//     time (fewer while the link does not need them: see sizer), and only
//     on a ready connection (ACK subscription confirmed);
//   - after any failure (timeout, publish error, lost connection) the next
//     session starts again from the oldest unconfirmed record (a new
//     window), so a newer record never overtakes an older one on retry.
type Sender struct {
	s       Config
	ob      *outbox.Outbox
	client  mqttclient.Transport
	acks    *AckQueue
	m       Metrics
	events  EventObserver // m, when it is one; else noEvents
	log     Logger
	ignored *IgnoredACKs
	removal *remover
	done    chan struct{}
}

// New returns a sender of ob over client; Run starts it.
func New(s Config, ob *outbox.Outbox, client mqttclient.Transport, acks *AckQueue, ignored *IgnoredACKs, m Metrics, log Logger) *Sender {
	events, ok := m.(EventObserver)
	if !ok {
		events = noEvents{}
	}
	return &Sender{
		s: s, ob: ob, client: client, acks: acks, ignored: ignored, m: m, events: events, log: log,
		removal: newRemover(ob, log),
		done:    make(chan struct{}),
	}
}

// Wait blocks until Run has returned and the last removals are written.
// It gives up when ctx ends or after shutdown.Send.
func (sd *Sender) Wait(ctx context.Context) error {
	if shutdown.Until(ctx, shutdown.Send, sd.done) {
		return nil
	}
	err := ctx.Err()
	if err == nil {
		err = context.DeadlineExceeded
	}
	return fmt.Errorf("outbox sender did not stop in time: %w", err)
}

// Run sends until ctx ends.
func (sd *Sender) Run(ctx context.Context) {
	defer close(sd.done)
	removerDone := make(chan struct{})
	go func() { sd.removal.run(ctx); close(removerDone) }()
	defer func() { <-removerDone }()

	failures := 0    // consecutive sessions without progress: the backoff's step
	stalled := false // the last session confirmed nothing
	for {
		sd.m.SetConnected(false)
		conn, err := sd.client.WaitReady(ctx)
		if err != nil {
			return
		}
		sd.m.SetConnected(true)
		progress, err := sd.session(ctx, conn, stalled)
		stalled = !progress
		if ctx.Err() != nil {
			return
		}
		if progress {
			failures = 0
		}
		failures++
		delay := sd.s.Retry.After(failures)
		sd.m.OnRetried()
		if outbox.IsDamaged(err) || format.IsNewer(err) { // no resend helps
			sd.log.Errorf("Outbox %s: %v", sd.ob.Path(), err)
		} else {
			sd.log.Warnf("Outbox %s: %v; resending from the oldest unconfirmed record in %s", sd.ob.Path(), err, delay)
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
	}
}

// session sends on one connection until it fails or ctx ends. progress
// reports whether anything was confirmed. After a session that confirmed
// nothing (stalled) the window's floor is initialWindow records even when
// packing: a floor of frames too big for a slow link must not time out
// every session.
func (sd *Sender) session(ctx context.Context, conn mqttclient.Conn, stalled bool) (progress bool, err error) {
	wait, what := sd.s.confirm().wait(sd.s), sd.s.confirm().what()
	rm := pubackLimit(conn.Limits())
	floor := initialWindow
	if !stalled {
		floor = floorWindow(sd.s.Pack.MaxEvents, rm)
	}
	w := newWindow(newSizer(sd.s.Window, floor, time.Now()), rm, sd.s.Pack.MaxEvents, wait)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	shown, held := -1, false

	// A record leaves the outbox only when the publish that carried it,
	// alone or in a frame, is confirmed: all of a frame's records at once.
	confirm := func(f *flight, now time.Time) {
		w.remove(f, now)
		sd.ignored.confirmed(f.id)
		latency := time.Since(f.sentAt)
		for _, r := range f.recs {
			sd.removal.add(r.Seq)
			sd.m.OnConfirmed(latency)
			sd.events.OnEventConfirmed(r.EventID)
		}
		progress = true
	}
	publish := func(recs []outbox.Record) (int, string, Token) {
		n, id, pub := sd.packed(recs, conn.Limits().MaximumPacketSize)
		tok := conn.PublishAsync(pub)
		for _, r := range recs[:n] {
			sd.m.OnPublished()
			sd.events.OnEventPublished(r.EventID)
		}
		return n, id, tok
	}
	onCorrupt := func(err *outbox.CorruptRecordError) {
		// Leave it in place for an operator; skipping it is the only way
		// the records behind it get delivered.
		sd.log.Errorf("Skipping unreadable record (it stays in the outbox): %v", err)
	}

	for {
		if err := w.refill(sd.ob, sd.removal.confirmed, publish, onCorrupt); err != nil {
			return progress, fmt.Errorf("reading outbox: %w", err)
		}
		if eff := sd.effectiveWindow(w); eff != shown {
			shown = eff
			sd.m.SetWindow(eff)
		}
		if w.heldByServer && !held {
			held = true
			sd.log.Infof("The server's Receive Maximum of %d holds the publishes awaiting a PUBACK below the window of %d records this link could carry (outbox %s); raise it on the broker (mosquitto: max_inflight_messages) for more throughput on a long round trip",
				rm, w.sz.limit(), sd.ob.Path())
		}

		// The broker PUBACKs one client's publishes in order, so waiting on
		// the oldest unread token is enough; newer ones are collected
		// behind it. With end_to_end a PUBACK confirms nothing, but a
		// failed one (a lost connection, an MQTT 5 reason code) ends the
		// session just the same.
		var timeout <-chan time.Time
		var nextPuback <-chan struct{}
		if f := w.oldest(); f != nil {
			timer.Reset(time.Until(f.deadline))
			timeout = timer.C
		}
		if f := w.nextUnread(); f != nil {
			nextPuback = f.tok.Done()
		}
		select {
		case <-ctx.Done():
			return progress, ctx.Err()
		case <-conn.Lost():
			return progress, errors.New("connection lost")
		case <-nextPuback:
			now := time.Now()
			for f := w.nextUnread(); f != nil && tokenDone(f.tok); f = w.nextUnread() {
				w.read()
				if f.done {
					continue // its ACK came first: nothing to learn from the PUBACK
				}
				if err := f.tok.Error(); err != nil {
					return progress, publishFailed(sd.m, f.id, f.rec.Topic, err)
				}
				if sd.s.confirm().pubackConfirms() {
					confirm(f, now)
				}
			}
		case <-sd.acks.signal:
			now := time.Now()
			for _, id := range sd.acks.drain() {
				if f := w.lookup(id); f != nil {
					confirm(f, now)
				} else {
					sd.ignored.unmatched(id)
				}
			}
		case <-sd.ob.Appended():
		case <-timeout:
			f := w.oldest()
			return progress, fmt.Errorf("no %s for %s within %s", what, f.name(), wait)
		}
	}
}

// effectiveWindow is how many records may be unconfirmed now (see
// Confirmation.limit).
func (sd *Sender) effectiveWindow(w *window) int {
	return sd.s.confirm().limit(w.sz.limit(), w.pubackMax*max(1, sd.s.Pack.MaxEvents))
}

// confirm is the Confirmation, ByPuback when none is set.
func (c Config) confirm() Confirmation {
	if c.Confirm == nil {
		return byPuback{}
	}
	return c.Confirm
}

// remover deletes confirmed records in batches: one transaction (one fsync)
// for everything confirmed since the last one.
type remover struct {
	ob  *outbox.Outbox
	log Logger

	mu      sync.Mutex
	pending map[uint64]struct{} // confirmed, not yet removed: never resend
	signal  chan struct{}
}

func newRemover(ob *outbox.Outbox, log Logger) *remover {
	return &remover{ob: ob, log: log, pending: map[uint64]struct{}{}, signal: make(chan struct{}, 1)}
}

func (r *remover) add(seq uint64) {
	r.mu.Lock()
	r.pending[seq] = struct{}{}
	r.mu.Unlock()
	r.kick()
}

func (r *remover) confirmed(seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.pending[seq]
	return ok
}

// run removes until ctx ends, then makes one last attempt.
func (r *remover) run(ctx context.Context) {
	for {
		select {
		case <-r.signal:
			if err := r.flush(); err != nil {
				r.log.Errorf("Removing confirmed records from outbox %s failed, will retry: %v", r.ob.Path(), err)
				select {
				case <-time.After(time.Second):
				case <-ctx.Done():
				}
				r.kick()
			}
		case <-ctx.Done():
			if err := r.flush(); err != nil {
				r.log.Errorf("Removing confirmed records from outbox %s failed; they will be published again after restart: %v", r.ob.Path(), err)
			}
			return
		}
	}
}

func (r *remover) kick() {
	select {
	case r.signal <- struct{}{}:
	default:
	}
}

// flush removes everything confirmed so far. What is confirmed while it
// runs, or what a failed removal leaves, stays pending for the next flush.
func (r *remover) flush() error {
	r.mu.Lock()
	batch := make([]uint64, 0, len(r.pending))
	for seq := range r.pending {
		batch = append(batch, seq)
	}
	r.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	if err := r.ob.Remove(batch...); err != nil {
		return err
	}
	r.mu.Lock()
	for _, seq := range batch {
		delete(r.pending, seq)
	}
	r.mu.Unlock()
	return nil
}
