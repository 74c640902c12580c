package sender

import (
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
)

// Pack is how many consecutive records one PUBLISH may carry as a frame
// (internal/frame). MaxEvents 1 (or 0) is no packing: every record is
// published alone, in exactly the bytes it would have without frames.
type Pack struct {
	MaxEvents   int    // records per frame at most
	MaxBytes    int    // frame bytes (before compression) at most; a record larger still rides alone
	Compression string // frame.None or frame.Zstd
}

// DefaultPackMaxBytes is pack.max_bytes's default.
const DefaultPackMaxBytes = 64 << 10

// on reports whether frames are sent at all.
func (p Pack) on() bool { return p.MaxEvents > 1 }

// packetOverhead bounds a PUBLISH's bytes beyond its topic and payload
// (fixed header, lengths, packet ID, an empty property section).
const packetOverhead = 16

// frameOverhead bounds the bytes a frame adds to an event beyond its ID,
// topic, properties, trace context and payload: the length prefixes.
const frameOverhead = 8 * 5

// packed is the next publish of the records at the front of a window's
// pending ones (see Config.nextPublish); outbox records carry the
// configured retain flag.
func (sd *Sender) packed(recs []outbox.Record, maxPacket uint32) (n int, id string, pub mqttmsg.Publication) {
	evs := make([]mqttmsg.Event, min(len(recs), max(1, sd.s.Pack.MaxEvents)))
	for i := range evs {
		evs[i] = recs[i].Event
		evs[i].Retained = sd.s.Retained
	}
	return sd.s.nextPublish(evs, maxPacket)
}

// nextPublish is the next publish of evs (at least one, in order): a frame
// of as many as fit, or the first alone (as it is, never a frame of one).
// It never waits for more events: it packs what is there. Events for
// another topic than the first's, or that cannot ride in a frame, end the
// frame before them. maxPacket is the server's Maximum Packet Size (0:
// none): a frame stays within it, or its events would be refused together
// for ever.
func (c Config) nextPublish(evs []mqttmsg.Event, maxPacket uint32) (n int, id string, pub mqttmsg.Publication) {
	p := c.Pack
	budget := p.MaxBytes
	if maxPacket > 0 {
		budget = min(budget, int(maxPacket)-packetOverhead-len(evs[0].Topic))
	}
	alone := func() (int, string, mqttmsg.Publication) {
		return 1, evs[0].EventID, publication(evs[0], c)
	}
	if !p.on() || len(evs) < 2 {
		return alone()
	}
	events := make([]frame.Event, 0, min(len(evs), p.MaxEvents))
	var topic string
	size := 0
	for _, ev := range evs[:min(len(evs), p.MaxEvents)] {
		fe, t, err := c.Encoding.FrameEvent(ev)
		if err != nil || ev.Retained || (len(events) > 0 && t != topic) {
			break
		}
		sz := eventSize(fe)
		if len(events) > 0 && size+sz > budget {
			break
		}
		events, topic, size = append(events, fe), t, size+sz
	}
	if len(events) < 2 {
		return alone()
	}
	b, fid, err := frame.Encode(events, frame.Options{Compression: p.Compression})
	if err != nil || maxPacket > 0 && len(b)+len(topic)+packetOverhead > int(maxPacket) {
		return alone() // an event no frame can carry goes as it is
	}
	ev := mqttmsg.Event{EventID: fid, Topic: topic, Payload: b}
	return len(events), fid, publication(ev, c)
}

// eventSize is about what fe takes in a frame's body.
func eventSize(fe frame.Event) int {
	n := len(fe.ID) + len(fe.Topic) + len(fe.Payload) + frameOverhead
	for _, p := range fe.Properties {
		n += len(p.Key) + len(p.Value)
	}
	for k, v := range fe.Trace {
		n += len(k) + len(v)
	}
	return n
}
