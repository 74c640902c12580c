package sender

import (
	"container/list"
	"errors"
	"fmt"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
)

// Token is a publish in progress.
type Token = mqttclient.Token

// tokenDone reports whether a publish token has completed, without waiting.
func tokenDone(tok Token) bool {
	select {
	case <-tok.Done():
		return true
	default:
		return false
	}
}

// flight is one publish awaiting its confirmation: a record, or a frame of
// consecutive records (internal/frame), confirmed together.
type flight struct {
	id       string          // what its confirmation names: the event ID, or the frame's ID
	rec      outbox.Record   // the oldest of recs
	recs     []outbox.Record // in outbox order
	tok      Token
	sentAt   time.Time
	deadline time.Time
	mark     sendMark // the sizer's state at the send
	elem     *list.Element
	done     bool // confirmed: an end-to-end ACK can come before its PUBACK is read
}

// name is what errors call f: its event, or its frame and first event.
func (f *flight) name() string {
	return publishName(f.id, len(f.recs), f.rec.EventID)
}

// publishName is what errors call a publish of n events named by id whose
// first event is first: the event, or the frame and its first event.
func publishName(id string, n int, first string) string {
	if n == 1 {
		return "event " + id
	}
	return fmt.Sprintf("frame %s (%d events from %s)", id, n, first)
}

// source is where a window reads records, oldest first: the outbox.
type source interface {
	Read(afterSeq uint64, max int) ([]outbox.Record, error)
}

// publisher publishes the next of recs (at least one, in outbox order):
// n of them in one PUBLISH, and the ID its confirmation will name.
type publisher func(recs []outbox.Record) (n int, id string, tok Token)

// one is the publisher of one record per PUBLISH, named by its event ID.
func one(publish func(outbox.Record) Token) publisher {
	return func(recs []outbox.Record) (int, string, Token) { return 1, recs[0].EventID, publish(recs[0]) }
}

// window is what one session has published and not yet seen confirmed.
//
// Invariants, enforced here:
//   - records enter in outbox (FIFO) order and at most the sizer's limit
//     of records (events, whether packed or not) are in it, in publishes
//     of which at most pubackMax await their PUBACK (the server's Receive
//     Maximum counts publishes, a frame as one; with end_to_end a publish
//     the broker has PUBACKed holds no packet ID while it waits for its
//     ACK);
//   - a new window starts from the oldest record of the outbox, so after a
//     failed session every unconfirmed record is sent again, oldest first,
//     and a newer record never overtakes an older one;
//   - a record confirmed but not yet removed from the outbox is not sent
//     again (skip reports those);
//   - the oldest flight has the earliest deadline: deadlines grow front to
//     back because records enter in time order with one timeout.
type window struct {
	sz        *sizer
	pubackMax int
	// perPublish is the most records one publish carries (pack.max_events,
	// or 1): a refill reads no more than its publishes can carry, not the
	// whole room of a large window for every PUBACK that frees a publish.
	perPublish int
	wait       time.Duration // how long a flight waits for its confirmation
	inflight   *list.List    // of *flight, oldest first
	records    int           // records in inflight's flights
	byID       map[string]*flight
	cursor     uint64 // Seq of the last record read; 0 = from the oldest
	// unread are the flights whose publish token has not been read yet, in
	// publish order, which is the order the broker PUBACKs them in: the
	// publishes awaiting their PUBACK. With confirm: broker it holds the
	// same flights as inflight.
	unread []*flight
	// heldByServer is set when a refill stopped at pubackMax below the
	// sizer's limit: the server's limit, not the link, holds the window.
	heldByServer bool
}

func newWindow(sz *sizer, pubackMax, perPublish int, wait time.Duration) *window {
	return &window{sz: sz, pubackMax: pubackMax, perPublish: max(1, perPublish), wait: wait, inflight: list.New(), byID: map[string]*flight{}}
}

// pubackLimit is how many publishes may await their PUBACK on a
// connection: the server's Receive Maximum (MQTT 5 §3.2.2.3.3: a client
// must not have more unacknowledged QoS 1 publishes than that; 65535, the
// protocol's most, on 3.1.1).
func pubackLimit(l mqttclient.ServerLimits) int {
	if rm := int(l.ReceiveMaximum); rm > 0 {
		return rm
	}
	return int(mqttclient.NoLimits.ReceiveMaximum)
}

// room is how many more records may be published now, and in how many
// more publishes.
func (w *window) room() (records, publishes int) {
	w.trimUnread()
	return w.sz.limit() - w.len(), w.pubackMax - len(w.unread)
}

// len is the number of records in flight.
func (w *window) len() int { return w.records }

// refill reads from src after the cursor and publishes records until the
// window is full or src has no more. skip reports records confirmed but not
// yet removed; publish sends the next records, one or a frame of them. A
// record that cannot be decoded is passed to onCorrupt and stepped over (it
// stays in the outbox); any other read error ends the refill.
//
// A frame takes what is waiting now, never waits to fill: a record read
// alone is published alone.
func (w *window) refill(src source, skip func(seq uint64) bool, publish publisher, onCorrupt func(*outbox.CorruptRecordError)) error {
	for {
		n, pubs := w.room()
		if n <= 0 || pubs <= 0 {
			w.heldByServer = w.heldByServer || pubs <= 0 && w.len() < w.sz.limit()
			return nil
		}
		recs, err := src.Read(w.cursor, min(n, pubs*w.perPublish))
		var corrupt *outbox.CorruptRecordError
		if err != nil && !errors.As(err, &corrupt) {
			return err
		}
		read := len(recs)
		var pending []outbox.Record // read, not confirmed already: to publish
		for _, r := range recs {    // with a corrupt record: those before it
			if skip(r.Seq) {
				if len(pending) == 0 {
					w.cursor = r.Seq
				}
				continue
			}
			pending = append(pending, r)
		}
		for len(pending) > 0 && pubs > 0 {
			k, id, tok := publish(pending)
			now := time.Now()
			f := &flight{id: id, rec: pending[0], recs: pending[:k:k], tok: tok, sentAt: now, deadline: now.Add(w.wait), mark: w.sz.sent()}
			f.elem = w.inflight.PushBack(f)
			w.records += k
			w.byID[id] = f
			w.unread = append(w.unread, f)
			w.cursor = pending[k-1].Seq
			pending = pending[k:]
			pubs--
		}
		if len(pending) > 0 {
			// Out of publishes: the rest is read again at the next refill.
			continue
		}
		if corrupt != nil {
			onCorrupt(corrupt)
			w.cursor = corrupt.Seq
			continue
		}
		if read == 0 {
			w.sz.appLimited(w.len()) // the outbox ran dry below the limit
			return nil
		}
		if len(recs) > 0 && w.cursor < recs[len(recs)-1].Seq {
			w.cursor = recs[len(recs)-1].Seq // skipped ones at the end
		}
	}
}

// oldest is the flight waiting longest, or nil.
func (w *window) oldest() *flight {
	if e := w.inflight.Front(); e != nil {
		return e.Value.(*flight)
	}
	return nil
}

// lookup returns the flight whose confirmation names id, or nil.
func (w *window) lookup(id string) *flight { return w.byID[id] }

// remove takes a flight confirmed at now out, making room for the next
// records, and tells the sizer of each of its records: the window counts
// records, whether they travel alone or in frames.
func (w *window) remove(f *flight, now time.Time) {
	w.inflight.Remove(f.elem)
	delete(w.byID, f.id)
	f.done = true
	for range f.recs {
		w.records--
		w.sz.confirmed(now, f.sentAt, f.mark, w.len())
	}
}

// trimUnread drops the confirmed flights at the front of unread whose
// PUBACK has come too: their token needs no reading. A confirmed flight
// whose PUBACK has not come still holds its packet ID.
func (w *window) trimUnread() {
	for len(w.unread) > 0 && w.unread[0].done && tokenDone(w.unread[0].tok) {
		w.unread[0] = nil
		w.unread = w.unread[1:]
	}
}

// nextUnread is the oldest flight whose publish token is still to be read,
// or nil. It can be confirmed already (an end-to-end ACK before the PUBACK).
func (w *window) nextUnread() *flight {
	w.trimUnread()
	if len(w.unread) == 0 {
		return nil
	}
	return w.unread[0]
}

// read marks the token of nextUnread as read.
func (w *window) read() {
	w.unread[0] = nil
	w.unread = w.unread[1:]
}
