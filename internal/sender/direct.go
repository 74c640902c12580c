package sender

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
)

// Direct publishes without an outbox: each Send waits for its own
// confirmation, so the upstream message is acknowledged only after it.
// Concurrent sends are in flight together.
type Direct struct {
	s      Config
	client mqttclient.Transport
	acks   *AckQueue
	m      Metrics

	ignored *IgnoredACKs

	mu      sync.Mutex
	waiters map[string][]chan struct{}
	done    chan struct{}
}

// NewDirect returns a direct sender over client; Run starts its ACK matching.
func NewDirect(s Config, client mqttclient.Transport, acks *AckQueue, ignored *IgnoredACKs, m Metrics) *Direct {
	return &Direct{
		s: s, client: client, acks: acks, ignored: ignored, m: m,
		waiters: map[string][]chan struct{}{},
		done:    make(chan struct{}),
	}
}

// Run matches incoming ACKs with waiting sends until ctx ends.
func (d *Direct) Run(ctx context.Context) {
	defer close(d.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.acks.signal:
			for _, id := range d.acks.drain() {
				d.mu.Lock()
				ws := d.waiters[id]
				delete(d.waiters, id)
				d.mu.Unlock()
				if len(ws) == 0 {
					d.ignored.unmatched(id)
					continue
				}
				d.ignored.confirmed(id)
				for _, w := range ws {
					close(w)
				}
			}
		}
	}
}

// Wait blocks until Run has returned or ctx ends (at most shutdown.Send).
func (d *Direct) Wait(ctx context.Context) {
	shutdown.Until(ctx, shutdown.Send, d.done)
}

func (d *Direct) expect(id string) chan struct{} {
	ch := make(chan struct{})
	d.mu.Lock()
	d.waiters[id] = append(d.waiters[id], ch)
	d.mu.Unlock()
	return ch
}

func (d *Direct) forget(id string, ch chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ws := d.waiters[id]
	for i, w := range ws {
		if w == ch {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(d.waiters, id)
	} else {
		d.waiters[id] = ws
	}
}

// Send publishes rec and returns once it is confirmed, or an error after
// PublishTimeout (PUBACK) or the wait of an end-to-end ACK.
func (d *Direct) Send(ctx context.Context, rec mqttmsg.Event) error {
	pubCtx, cancel := context.WithTimeout(ctx, d.s.PublishTimeout)
	defer cancel()
	conn, err := d.client.WaitReady(pubCtx)
	if err != nil {
		return fmt.Errorf("event %s: no broker connection within %s: %w", rec.EventID, d.s.PublishTimeout, err)
	}
	var acked chan struct{}
	if !d.s.confirm().pubackConfirms() {
		acked = d.expect(rec.EventID)
		defer d.forget(rec.EventID, acked)
	}
	start := time.Now()
	d.m.OnPublished()
	if err := conn.Publish(pubCtx, publication(rec, d.s)); err != nil {
		d.m.OnRetried()
		var rc *mqttclient.ReasonCodeError
		if errors.As(err, &rc) {
			return publishFailed(d.m, rec.EventID, rec.Topic, err)
		}
		return fmt.Errorf("event %s: publish to %q not confirmed: %w", rec.EventID, rec.Topic, err)
	}
	if acked != nil {
		wait := d.s.confirm().wait(d.s)
		ackCtx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		select {
		case <-acked:
		case <-ackCtx.Done():
			d.m.OnRetried()
			return fmt.Errorf("event %s: no %s within %s", rec.EventID, d.s.confirm().what(), wait)
		case <-conn.Lost():
			d.m.OnRetried()
			return fmt.Errorf("event %s: connection lost while waiting for its ACK", rec.EventID)
		}
	}
	d.m.OnConfirmed(time.Since(start))
	return nil
}

// SendAll sends the records whose errs entry is nil concurrently, each
// waiting for its own confirmation, and stores each outcome in errs.
func (d *Direct) SendAll(ctx context.Context, recs []mqttmsg.Event, errs []error) {
	var wg sync.WaitGroup
	for i, rec := range recs {
		if errs[i] != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.Send(ctx, rec)
		}()
	}
	wg.Wait()
}
