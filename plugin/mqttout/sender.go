package mqttout

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
)

// sender publishes the outbox oldest first and removes what is confirmed.
//
// Invariants, enforced here:
//   - a record is removed only after its confirmation (PUBACK for broker,
//     an ACK with its event ID for end_to_end); no failure removes anything;
//   - records are published in FIFO order, at most window unconfirmed at a
//     time, and only on a ready connection (ACK subscription confirmed);
//   - after any failure (timeout, publish error, lost connection) the next
//     session starts again from the oldest unconfirmed record, so a newer
//     record never overtakes an older one on retry.
type sender struct {
	s       settings
	ob      *outbox.Outbox
	client  *mqttclient.Client
	acks    *ackInbox
	m       *metrics
	log     *service.Logger
	ignored *ignoredACKs
	removal *remover
	done    chan struct{}
}

func newSender(s settings, ob *outbox.Outbox, client *mqttclient.Client, acks *ackInbox, ignored *ignoredACKs, m *metrics, log *service.Logger) *sender {
	return &sender{
		s: s, ob: ob, client: client, acks: acks, ignored: ignored, m: m, log: log,
		removal: newRemover(ob, log),
		done:    make(chan struct{}),
	}
}

// wait blocks until run has returned and the last removals are written.
func (sd *sender) wait(ctx context.Context) error {
	select {
	case <-sd.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("outbox sender did not stop in time: %w", ctx.Err())
	}
}

func (sd *sender) run(ctx context.Context) {
	defer close(sd.done)
	removerDone := make(chan struct{})
	go func() { sd.removal.run(ctx); close(removerDone) }()
	defer func() { <-removerDone }()

	delay := sd.s.retry.Initial
	for {
		sd.m.connected.Set(0)
		conn, err := sd.client.WaitReady(ctx)
		if err != nil {
			return
		}
		sd.m.connected.Set(1)
		progress, err := sd.session(ctx, conn)
		if ctx.Err() != nil {
			return
		}
		if progress {
			delay = sd.s.retry.Initial
		}
		sd.m.onRetried()
		if errors.Is(err, boltfile.ErrDamaged) {
			sd.log.Errorf("Outbox %s: %v", sd.ob.Path(), err)
		} else {
			sd.log.Warnf("Outbox %s: %v; resending from the oldest unconfirmed record in %s", sd.ob.Path(), err, delay)
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
		delay = sd.s.retry.Next(delay)
	}
}

// flight is a published record awaiting its confirmation.
type flight struct {
	rec      outbox.Record
	tok      paho.Token
	sentAt   time.Time
	deadline time.Time
	elem     *list.Element
}

// tokenDone reports whether a publish token has completed, without waiting.
func tokenDone(tok paho.Token) bool {
	select {
	case <-tok.Done():
		return true
	default:
		return false
	}
}

// session sends on one connection until it fails or ctx ends. progress
// reports whether anything was confirmed.
func (sd *sender) session(ctx context.Context, conn *mqttclient.Conn) (progress bool, err error) {
	wait := sd.s.publishTimeout
	what := "PUBACK"
	if sd.s.endToEnd {
		wait, what = sd.s.ackTimeout, "ACK on "+sd.s.ackTopic
	}
	inflight := list.New() // oldest first; deadlines grow front to back
	byID := map[string]*flight{}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	confirm := func(f *flight) {
		inflight.Remove(f.elem)
		delete(byID, f.rec.EventID)
		sd.ignored.confirmed(f.rec.EventID)
		sd.removal.add(f.rec.Seq)
		sd.m.onConfirmed(time.Since(f.sentAt))
		progress = true
	}

	var cursor uint64 // Seq of the last record read; 0 = from the oldest
	for {
		for inflight.Len() < sd.s.window {
			recs, err := sd.ob.Read(cursor, sd.s.window-inflight.Len())
			var corrupt *outbox.CorruptRecordError
			if err != nil && !errors.As(err, &corrupt) {
				return progress, fmt.Errorf("reading outbox: %w", err)
			}
			for _, r := range recs { // with a corrupt record: those before it
				cursor = r.Seq
				if sd.removal.confirmed(r.Seq) {
					continue
				}
				now := time.Now()
				f := &flight{rec: r, sentAt: now, deadline: now.Add(wait)}
				f.elem = inflight.PushBack(f)
				byID[r.EventID] = f
				f.tok = conn.PublishAsync(r.Topic, 1, sd.s.retainedConst, r.Payload)
				sd.m.onPublished()
			}
			if corrupt != nil {
				// Leave it in place for an operator; skipping it is the
				// only way the records behind it get delivered.
				sd.log.Errorf("Skipping unreadable record (it stays in the outbox): %v", err)
				cursor = corrupt.Seq
				continue
			}
			if len(recs) == 0 {
				break
			}
		}

		// The broker PUBACKs one client's publishes in order, so waiting on
		// the oldest token is enough; newer ones are collected behind it.
		// A failed token means a lost connection, which ends the session
		// in either mode, so end_to_end need not watch tokens at all.
		var timeout <-chan time.Time
		var oldestPuback <-chan struct{}
		if front := inflight.Front(); front != nil {
			f := front.Value.(*flight)
			timer.Reset(time.Until(f.deadline))
			timeout = timer.C
			if !sd.s.endToEnd {
				oldestPuback = f.tok.Done()
			}
		}
		select {
		case <-ctx.Done():
			return progress, ctx.Err()
		case <-conn.Lost():
			return progress, errors.New("connection lost")
		case <-oldestPuback:
			for e := inflight.Front(); e != nil && tokenDone(e.Value.(*flight).tok); e = inflight.Front() {
				f := e.Value.(*flight)
				if err := f.tok.Error(); err != nil {
					return progress, fmt.Errorf("publishing event %s to %q failed: %w", f.rec.EventID, f.rec.Topic, err)
				}
				confirm(f)
			}
		case <-sd.acks.signal:
			for _, id := range sd.acks.drain() {
				if f := byID[id]; f != nil {
					confirm(f)
				} else {
					sd.ignored.unmatched(id)
				}
			}
		case <-sd.ob.Appended():
		case <-timeout:
			f := inflight.Front().Value.(*flight)
			return progress, fmt.Errorf("no %s for event %s within %s", what, f.rec.EventID, wait)
		}
	}
}

// remover deletes confirmed records in batches: one transaction (one fsync)
// for everything confirmed since the last one.
type remover struct {
	ob  *outbox.Outbox
	log *service.Logger

	mu      sync.Mutex
	pending map[uint64]struct{} // confirmed, not yet removed: never resend
	signal  chan struct{}
}

func newRemover(ob *outbox.Outbox, log *service.Logger) *remover {
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
