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
	return d.send(ctx, publishName(rec.EventID, 1, rec.EventID), rec.EventID, publication(rec, d.s), 1)
}

// send publishes pub, which carries n events, and returns once the
// confirmation naming id comes (its PUBACK, or an end-to-end ACK with id);
// name is what errors call it.
func (d *Direct) send(ctx context.Context, name, id string, pub mqttmsg.Publication, n int) error {
	pubCtx, cancel := context.WithTimeout(ctx, d.s.PublishTimeout)
	defer cancel()
	conn, err := d.client.WaitReady(pubCtx)
	if err != nil {
		return fmt.Errorf("%s: no broker connection within %s: %w", name, d.s.PublishTimeout, err)
	}
	var acked chan struct{}
	if !d.s.confirm().pubackConfirms() {
		acked = d.expect(id)
		defer d.forget(id, acked)
	}
	start := time.Now()
	for range n {
		d.m.OnPublished()
	}
	if err := conn.Publish(pubCtx, pub); err != nil {
		d.m.OnRetried()
		var rc *mqttclient.ReasonCodeError
		if errors.As(err, &rc) {
			return publishFailed(d.m, id, pub.Topic, err)
		}
		return fmt.Errorf("%s: publish to %q not confirmed: %w", name, pub.Topic, err)
	}
	if acked != nil {
		wait := d.s.confirm().wait(d.s)
		ackCtx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		select {
		case <-acked:
		case <-ackCtx.Done():
			d.m.OnRetried()
			return fmt.Errorf("%s: no %s within %s", name, d.s.confirm().what(), wait)
		case <-conn.Lost():
			d.m.OnRetried()
			return fmt.Errorf("%s: connection lost while waiting for its ACK", name)
		}
	}
	latency := time.Since(start)
	for range n {
		d.m.OnConfirmed(latency)
	}
	return nil
}

// SendAll sends the records whose errs entry is nil concurrently, each
// waiting for its own confirmation, and stores each outcome in errs. With
// Pack, consecutive records travel as frames (see Config.nextPublish), one
// PUBLISH and one confirmation for each, and every record of a frame gets
// its frame's outcome: a caller that acknowledges its source only when
// SendAll has succeeded for all of it (a bridge) acknowledges a frame it
// received only after every event of it was confirmed downstream.
func (d *Direct) SendAll(ctx context.Context, recs []mqttmsg.Event, errs []error) {
	var wg sync.WaitGroup
	for _, g := range d.publishes(ctx, recs, errs) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := d.send(ctx, g.name, g.id, g.pub, len(g.members))
			for _, i := range g.members {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
}

// directPublish is one PUBLISH of SendAll: a record, or a frame of them.
type directPublish struct {
	name, id string
	pub      mqttmsg.Publication
	members  []int // the indexes of its records in SendAll's recs
}

// publishes are the PUBLISHes that carry the records of recs whose errs
// entry is nil, in order. Packing needs the server's Maximum Packet Size,
// so it waits (at most PublishTimeout) for a connection; without one, each
// record goes alone and fails as Send does.
func (d *Direct) publishes(ctx context.Context, recs []mqttmsg.Event, errs []error) []directPublish {
	var todo []int
	for i := range recs {
		if errs[i] == nil {
			todo = append(todo, i)
		}
	}
	var maxPacket uint32
	packing := d.s.Pack.on() && len(todo) > 1
	if packing {
		waitCtx, cancel := context.WithTimeout(ctx, d.s.PublishTimeout)
		conn, err := d.client.WaitReady(waitCtx)
		cancel()
		if err == nil {
			maxPacket = conn.Limits().MaximumPacketSize
		} else {
			packing = false
		}
	}
	var out []directPublish
	for len(todo) > 0 {
		if !packing {
			rec := recs[todo[0]]
			out = append(out, directPublish{name: publishName(rec.EventID, 1, rec.EventID), id: rec.EventID, pub: publication(rec, d.s), members: todo[:1]})
			todo = todo[1:]
			continue
		}
		evs := make([]mqttmsg.Event, min(len(todo), d.s.Pack.MaxEvents))
		for k := range evs {
			evs[k] = recs[todo[k]]
		}
		n, id, pub := d.s.nextPublish(evs, maxPacket)
		out = append(out, directPublish{name: publishName(id, n, evs[0].EventID), id: id, pub: pub, members: todo[:n:n]})
		todo = todo[n:]
	}
	return out
}
