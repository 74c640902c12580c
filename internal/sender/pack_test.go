package sender

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
)

// recordingConn PUBACKs every publish at once and keeps what was published.
type recordingConn struct {
	instantConn
	mu   sync.Mutex
	pubs []mqttmsg.Publication
}

func (c *recordingConn) PublishAsync(p mqttmsg.Publication) Token {
	c.mu.Lock()
	c.pubs = append(c.pubs, p)
	c.mu.Unlock()
	return doneToken{}
}

func (c *recordingConn) published() []mqttmsg.Publication {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.pubs)
}

// connQueue hands out its connections in turn, each once the one before
// it is lost.
type connQueue struct{ conns chan mqttclient.Conn }

func (q connQueue) WaitReady(ctx context.Context) (mqttclient.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (q connQueue) Current() mqttclient.Conn    { return nil }
func (q connQueue) Close(context.Context) error { return nil }

var e2eEncoding = codec.Encoding{Mode: codec.None, EndToEnd: true, DataTopic: "data", MaxPayloadBytes: 1 << 20}

// appendIngress appends events from..to as an end-to-end output stores
// them: ingress envelopes to the data topic.
func appendIngress(t *testing.T, ob *outbox.Outbox, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := from; i <= to; i++ {
		ev, err := e2eEncoding.Encode(fmt.Sprintf("e%d", i), fmt.Sprintf("dest/%d", i), fmt.Appendf(nil, `{"n":%d}`, i), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.Append(ctx, outbox.Entry{Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
}

// framesOf decodes the publications from the index from on: the event IDs
// of each, and the frame IDs (an event published alone is its own ID).
func framesOf(t *testing.T, pubs []mqttmsg.Publication) (groups [][]string, ids []string) {
	t.Helper()
	for _, p := range pubs {
		if !frame.Is(p.Payload) {
			in, err := envelope.DecodeIngress(p.Payload)
			if err != nil {
				t.Fatalf("a publication is neither a frame nor an ingress envelope: %v", err)
			}
			groups, ids = append(groups, []string{in.EventID}), append(ids, in.EventID)
			continue
		}
		id, events, err := frame.Decode(p.Payload, frame.DefaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		var g []string
		for _, e := range events {
			if want := fmt.Sprintf(`{"n":%s}`, e.ID[1:]); e.Topic != "dest/"+e.ID[1:] || string(e.Payload) != want {
				t.Fatalf("event %s in a frame: topic %q payload %s, want dest/%s and %s", e.ID, e.Topic, e.Payload, e.ID[1:], want)
			}
			g = append(g, e.ID)
		}
		if p.Topic != "data" {
			t.Fatalf("frame published to %q, want the data topic", p.Topic)
		}
		groups, ids = append(groups, g), append(ids, id)
	}
	return groups, ids
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The sender packs what is waiting into frames of at most max_events,
// oldest first; a frame's records leave the outbox only at the ACK naming
// the frame. A partial, forged, malformed, duplicate or stale ACK (one
// naming a frame of an earlier session, re-formed since) removes nothing.
func TestPackedRecordsLeaveOnlyAtTheirFramesACK(t *testing.T) {
	ob := openOutbox(t, 0)
	appendIngress(t, ob, 1, 10)

	m := &testMetrics{ignored: map[string]int{}, codes: map[byte]int{}}
	log := &lockedLog{}
	acks := NewAckQueue()
	ignored := NewIgnoredACKs(m, log)
	first := &recordingConn{instantConn: instantConn{lost: make(chan struct{})}}
	second := &recordingConn{instantConn: instantConn{lost: make(chan struct{})}}
	q := connQueue{conns: make(chan mqttclient.Conn, 2)}
	q.conns <- first
	cfg := Config{Window: 64, PublishTimeout: time.Minute, Confirm: ByAck("acks", time.Minute, nil),
		Retry: backoff.Backoff{Initial: time.Millisecond, Max: time.Millisecond}, Encoding: e2eEncoding,
		Pack: Pack{MaxEvents: 4, MaxBytes: 1 << 16, Compression: frame.Zstd}}
	sd := New(cfg, ob, q, acks, ignored, m, log)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); _ = sd.Wait(context.Background()) }()
	go sd.Run(ctx)

	eventually(t, "three frames", func() bool { return len(first.published()) == 3 })
	groups, ids := framesOf(t, first.published())
	want := [][]string{{"e1", "e2", "e3", "e4"}, {"e5", "e6", "e7", "e8"}, {"e9", "e10"}}
	if !slices.EqualFunc(groups, want, slices.Equal) {
		t.Fatalf("frames %v, want %v", groups, want)
	}

	pending := func() int { return ob.Stats().Pending }
	ignoredN := func(reason string) int { m.mu.Lock(); defer m.mu.Unlock(); return m.ignored[reason] }
	// Partial (a frame of part of the events), one event's own ID, malformed.
	acks.Push(frame.ID([]string{"e1", "e2", "e3"}))
	acks.Push("e1")
	acks.Receive("acks", []byte("not an ack"), nil, ignored)
	eventually(t, "three ignored ACKs", func() bool { return ignoredN(reasonUnknown) == 2 && ignoredN(ReasonMalformed) == 1 })
	if n := pending(); n != 10 {
		t.Fatalf("%d pending after partial and forged ACKs, want 10", n)
	}
	acks.Push(ids[0])
	eventually(t, "the first frame's records to leave", func() bool { return pending() == 6 })
	acks.Push(ids[0])
	eventually(t, "a duplicate ACK to be ignored", func() bool { return ignoredN(reasonDuplicate) == 1 })

	// A new session re-forms the frames from the oldest record: with two
	// more records waiting, e9..e12 is one frame now, and the ACK of the
	// old e9, e10 frame is stale.
	appendIngress(t, ob, 11, 12)
	q.conns <- second
	close(first.lost)
	eventually(t, "two frames on the new connection", func() bool { return len(second.published()) == 2 })
	groups2, ids2 := framesOf(t, second.published())
	want2 := [][]string{{"e5", "e6", "e7", "e8"}, {"e9", "e10", "e11", "e12"}}
	if !slices.EqualFunc(groups2, want2, slices.Equal) {
		t.Fatalf("frames after the reconnect %v, want %v", groups2, want2)
	}
	acks.Push(ids[2])
	eventually(t, "the stale ACK to be ignored", func() bool { return ignoredN(reasonUnknown) == 3 })
	if n := pending(); n != 8 {
		t.Fatalf("%d pending after a stale ACK, want 8", n)
	}
	acks.Push(ids2[1])
	acks.Push(ids2[0])
	eventually(t, "the outbox to drain", func() bool { return pending() == 0 })
}

// A record alone in the outbox is published alone, in the bytes it has
// without packing: nothing waits for a frame to fill.
func TestALoneRecordIsNotHeldForAFrame(t *testing.T) {
	ob := openOutbox(t, 0)
	appendIngress(t, ob, 1, 1)
	recs, err := ob.Read(0, 1)
	if err != nil {
		t.Fatal(err)
	}
	m := &testMetrics{ignored: map[string]int{}, codes: map[byte]int{}}
	conn := &recordingConn{instantConn: instantConn{lost: make(chan struct{})}}
	cfg := Config{Window: 64, PublishTimeout: time.Minute, Confirm: ByAck("acks", time.Minute, nil),
		Retry: backoff.Backoff{Initial: time.Millisecond, Max: time.Millisecond}, Encoding: e2eEncoding,
		Pack: Pack{MaxEvents: 64, MaxBytes: 1 << 16, Compression: frame.Zstd}}
	acks := NewAckQueue()
	sd := New(cfg, ob, oneConn{conn}, acks, NewIgnoredACKs(m, &lockedLog{}), m, &lockedLog{})
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); _ = sd.Wait(context.Background()) }()
	go sd.Run(ctx)
	eventually(t, "the record's publish", func() bool { return len(conn.published()) == 1 })
	if p := conn.published()[0]; !bytes.Equal(p.Payload, recs[0].Payload) || p.Topic != recs[0].Topic {
		t.Fatalf("published %q to %q, want the record as stored: %q to %q", p.Payload, p.Topic, recs[0].Payload, recs[0].Topic)
	}
	acks.Push("e1")
	eventually(t, "the record to leave", func() bool { return ob.Stats().Pending == 0 })
}

// With confirm: broker a frame's PUBACK confirms all its records at once
// (envelope: delivery, frames to the records' own topic), and a server's
// Maximum Packet Size bounds the frames.
func TestAFramesPUBACKConfirmsItsRecords(t *testing.T) {
	ob := openOutbox(t, 0)
	enc := codec.Encoding{Mode: codec.Delivery, MaxPayloadBytes: 1 << 20}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 1; i <= 40; i++ {
		ev, err := enc.Encode(fmt.Sprintf("e%d", i), "plant/a", fmt.Appendf(nil, `{"n":%d}`, i), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.Append(ctx, outbox.Entry{Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	m := &windowMetrics{testMetrics: testMetrics{ignored: map[string]int{}, codes: map[byte]int{}}}
	conn := &recordingConn{instantConn: instantConn{lost: make(chan struct{})}}
	limited := &packetLimitConn{recordingConn: conn, max: 400}
	cfg := Config{Window: 64, PublishTimeout: time.Minute, Confirm: ByPuback(),
		Retry: backoff.Backoff{Initial: time.Millisecond, Max: time.Millisecond}, Encoding: enc,
		Pack: Pack{MaxEvents: 64, MaxBytes: 1 << 16, Compression: frame.None}}
	sd := New(cfg, ob, oneConn{limited}, NewAckQueue(), NewIgnoredACKs(m, &lockedLog{}), m, &lockedLog{})
	runCtx, stop := context.WithCancel(context.Background())
	defer func() { stop(); _ = sd.Wait(context.Background()) }()
	go sd.Run(runCtx)
	eventually(t, "every record to leave the outbox", func() bool { return ob.Stats().Pending == 0 })
	var ids []string
	frames := 0
	for _, p := range conn.published() {
		if p.Topic != "plant/a" {
			t.Fatalf("published to %q, want the records' topic", p.Topic)
		}
		if len(p.Payload)+len(p.Topic)+packetOverhead > 400 {
			t.Fatalf("a publish of %d bytes beyond the server's Maximum Packet Size of 400", len(p.Payload))
		}
		if !frame.Is(p.Payload) {
			del, err := envelope.DecodeDelivery(p.Payload)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, del.EventID)
			continue
		}
		frames++
		_, events, err := frame.Decode(p.Payload, frame.DefaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events {
			if e.Topic != "" || string(e.Payload) != fmt.Sprintf(`{"n":%s}`, e.ID[1:]) {
				t.Fatalf("event %s: topic %q payload %s", e.ID, e.Topic, e.Payload)
			}
			ids = append(ids, e.ID)
		}
	}
	if frames < 2 {
		t.Fatalf("%d frames for 40 records under a 400-byte packet limit, want several", frames)
	}
	for i, id := range ids {
		if want := fmt.Sprintf("e%d", i+1); id != want {
			t.Fatalf("publish order %v, want e1..e40 in order", ids)
		}
	}
	m.mu.Lock()
	confirmed := m.confirmed
	m.mu.Unlock()
	if len(ids) != 40 || confirmed != 40 {
		t.Fatalf("%d events published, %d confirmed; want 40 each", len(ids), confirmed)
	}
}

// packetLimitConn is a recordingConn whose server states a Maximum Packet Size.
type packetLimitConn struct {
	*recordingConn
	max uint32
}

func (c *packetLimitConn) Limits() mqttclient.ServerLimits {
	l := mqttclient.NoLimits
	l.MaximumPacketSize = c.max
	return l
}
