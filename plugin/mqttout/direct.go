package mqttout

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
)

// direct publishes without an outbox: each Write waits for its own
// confirmation, so the upstream message is acknowledged only after it.
// Concurrent writes are in flight together.
type direct struct {
	s      settings
	client *mqttclient.Client
	acks   *ackInbox
	m      *metrics

	ignored *ignoredACKs

	mu      sync.Mutex
	waiters map[string][]chan struct{}
	done    chan struct{}
}

func newDirect(s settings, client *mqttclient.Client, acks *ackInbox, ignored *ignoredACKs, m *metrics) *direct {
	return &direct{
		s: s, client: client, acks: acks, ignored: ignored, m: m,
		waiters: map[string][]chan struct{}{},
		done:    make(chan struct{}),
	}
}

// run matches incoming ACKs with waiting writes until ctx ends.
func (d *direct) run(ctx context.Context) {
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

func (d *direct) wait(ctx context.Context) {
	select {
	case <-d.done:
	case <-ctx.Done():
	}
}

func (d *direct) expect(id string) chan struct{} {
	ch := make(chan struct{})
	d.mu.Lock()
	d.waiters[id] = append(d.waiters[id], ch)
	d.mu.Unlock()
	return ch
}

func (d *direct) forget(id string, ch chan struct{}) {
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

// send publishes rec and returns once it is confirmed, or an error after
// publish_timeout (PUBACK) or ack_timeout (end-to-end ACK).
func (d *direct) send(ctx context.Context, rec record) error {
	pubCtx, cancel := context.WithTimeout(ctx, d.s.publishTimeout)
	defer cancel()
	conn, err := d.client.WaitReady(pubCtx)
	if err != nil {
		return fmt.Errorf("event %s: no broker connection within %s: %w", rec.eventID, d.s.publishTimeout, err)
	}
	var acked chan struct{}
	if d.s.endToEnd {
		acked = d.expect(rec.eventID)
		defer d.forget(rec.eventID, acked)
	}
	start := time.Now()
	d.m.onPublished()
	if err := conn.Publish(pubCtx, rec.topic, 1, rec.retain, rec.payload); err != nil {
		d.m.onRetried()
		return fmt.Errorf("event %s: publish to %q not confirmed: %w", rec.eventID, rec.topic, err)
	}
	if acked != nil {
		ackCtx, cancel := context.WithTimeout(ctx, d.s.ackTimeout)
		defer cancel()
		select {
		case <-acked:
		case <-ackCtx.Done():
			d.m.onRetried()
			return fmt.Errorf("event %s: no ACK on %q within %s", rec.eventID, d.s.ackTopic, d.s.ackTimeout)
		case <-conn.Lost():
			d.m.onRetried()
			return fmt.Errorf("event %s: connection lost while waiting for its ACK", rec.eventID)
		}
	}
	d.m.onConfirmed(time.Since(start))
	return nil
}
