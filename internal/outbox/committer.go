package outbox

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/groupcommit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// request is one Append (entry != nil), Remove (seqs) or move of damaged
// records (aside) handed to the committer.
type request struct {
	ctx   context.Context
	entry *Entry
	size  int64
	seqs  []uint64
	aside []suspect

	// Results, written by the committer before it signals done.
	rec  Record
	err  error
	done chan struct{}

	// Per-attempt state.
	settled bool // has its final result; left out of further attempts
	added   bool // this attempt appended a new record
}

// entryFailure aborts an attempt because one request failed after it may
// have written into the transaction; the attempt is redone without it.
type entryFailure struct {
	req  *request
	err  error
	skip bool // a participant returned commit.ErrAlreadyApplied: settle with success, nothing appended
}

func (e *entryFailure) Error() string { return e.err.Error() }

// removalLinger is how long the committer holds a group of removals alone,
// for an append to carry them in its transaction. A removal's caller is the
// sender's remover, and a confirmed record is skipped until removed, so
// delaying it loses nothing (a power cut before it commits only sends the
// record again). Each commit writes at least a leaf, its branches and a
// meta page and fsyncs them: removals committed on their own doubled the
// bytes written per reading (docs/operations.md, "Flash wear"), and made
// the producers' next appends wait a whole fsync behind them. Under a
// steady stream the next append comes long before this passes; an idle
// outbox commits its last removals after it, so its statistics catch up.
// Nobody waits on a removal's latency except appends waiting for space,
// which it frees: then it is committed at once (see waits).
const removalLinger = time.Second

// commitLoop is the single writer: every waiting submission goes into one
// group, committed in transactions of up to MaxBatch requests each (one
// fsync per transaction). A group with an append waits up to CommitDelay
// for more.
func (o *Outbox) commitLoop() {
	defer close(o.committerDone)
	var batch []*request
	loop := groupcommit.Loop[[]*request]{Max: o.opts.MaxBatch, Linger: removalLinger, Delay: o.opts.CommitDelay, Waits: o.waits}
	loop.Run(o.reqs, o.closing, func(subs [][]*request) {
		for _, s := range subs {
			batch = append(batch, s...)
		}
		for rest := batch; len(rest) > 0; {
			n := min(len(rest), o.opts.MaxBatch)
			o.commit(rest[:n], false)
			for _, r := range rest[:n] {
				r.done <- struct{}{}
			}
			rest = rest[n:]
		}
		clear(batch) // let settled requests be collected
		batch = batch[:0]
	})
}

// waits reports whether a submission's caller waits on its commit: an
// append (a producer's acknowledgement), a move of damaged records (a
// read), or a removal while appends wait for the space it frees.
func (o *Outbox) waits(sub []*request) bool {
	for _, r := range sub {
		if r.entry != nil || r.aside != nil {
			return true
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.spaceWaiters > 0
}

// delta is what one committed attempt changes in Stats.
type delta struct {
	pending     int
	bytes       int64
	oldest      time.Time
	oldestKnown bool
	damaged     []DamagedRecord // moved aside by this attempt
}

// commit settles every request in batch. split is set when batch is one
// part of a group whose transaction failed, so it is not split again.
func (o *Outbox) commit(batch []*request, split bool) {
	for _, r := range batch {
		if r.entry != nil && !r.settled && r.ctx.Err() != nil {
			o.settle(r, Record{}, fmt.Errorf("outbox file %s: nothing appended: %w", o.path, r.ctx.Err()))
		}
	}
	var d delta
	commitFailed := false
	for {
		var err error
		d, err = o.attempt(batch)
		if err == nil {
			for _, r := range d.damaged {
				o.reportDamaged(r)
			}
		}
		var failure *entryFailure
		if errors.As(err, &failure) {
			// The transaction was rolled back; redo it without this request.
			if failure.skip {
				e := failure.req.entry
				o.settle(failure.req, Record{Event: mqttmsg.Event{EventID: e.EventID, Topic: e.Topic, Payload: e.Payload}}, nil)
			} else {
				o.settle(failure.req, Record{}, failure.err)
			}
			continue
		}
		if err != nil && !split {
			if removals, rest := splitRemovals(batch); len(removals) > 0 && len(rest) > 0 {
				// Removals free space and must not fail with the appends
				// that share their transaction: on a full disk that would
				// keep the outbox full for as long as producers keep
				// trying. Commit them alone first, then the rest.
				o.commit(removals, true)
				o.commit(rest, true)
				return
			}
		}
		if err != nil {
			err = fmt.Errorf("outbox file %s: commit failed, this group is not acknowledged: %w", o.path, err)
			for _, r := range batch {
				if !r.settled {
					o.settle(r, Record{}, err)
				}
			}
			d = delta{}
			commitFailed = true
		}
		break
	}

	added := false
	o.mu.Lock()
	if commitFailed {
		// A commit can fail after its pages were written (a failed fsync):
		// take the counters from the file, which is what the next
		// transaction builds on.
		o.reloadStatsLocked()
	} else {
		o.stats.Pending += d.pending
		o.stats.PendingBytes = max(o.stats.PendingBytes+d.bytes, 0)
		o.stats.Damaged += int64(len(d.damaged))
		if d.oldestKnown {
			o.stats.Oldest = d.oldest
		}
	}
	for _, r := range batch {
		if r.entry != nil {
			o.reservedN--
			o.reservedBytes -= r.size
			added = added || r.added
		}
	}
	o.wakeWaitersLocked()
	o.mu.Unlock()

	if added {
		select {
		case o.appended <- struct{}{}:
		default:
		}
	}
}

// splitRemovals parts batch into the requests that only delete or move
// records aside and the rest (appends, and requests already settled, which
// still need their reservation released).
func splitRemovals(batch []*request) (removals, rest []*request) {
	for _, r := range batch {
		if r.entry == nil && !r.settled {
			removals = append(removals, r)
		} else {
			rest = append(rest, r)
		}
	}
	return removals, rest
}

func (o *Outbox) settle(r *request, rec Record, err error) {
	r.rec, r.err, r.settled, r.added = rec, err, true, false
}

// attempt runs one transaction over the unsettled requests. Results of
// requests that succeed are provisional until it returns nil.
func (o *Outbox) attempt(batch []*request) (delta, error) {
	var d delta
	now := time.Now()
	err := o.file.Update(func(tx *bolt.Tx) error {
		records := tx.Bucket(bucketRecords)
		ids := tx.Bucket(bucketIDs)
		meta := tx.Bucket(bucketMeta)
		// Keys only ever grow, so full pages split cheaply.
		records.FillPercent = 1.0
		removed := false
		d = delta{}
		for _, r := range batch {
			if r.settled {
				continue
			}
			r.added = false
			if r.aside != nil {
				for _, b := range r.aside {
					if err := o.setAsideIn(tx, b.key, b.reason, &d); err != nil {
						return err
					}
				}
				r.err = nil
				continue
			}
			if r.entry == nil {
				n, nbytes, err := o.remove(tx, r.seqs, &d)
				if err != nil {
					return &entryFailure{req: r, err: err}
				}
				d.pending -= n
				d.bytes -= nbytes
				removed = removed || n > 0
				r.err = nil
				continue
			}
			if err := o.append(tx, records, ids, r, now, &d); err != nil {
				return err
			}
			if r.added {
				d.pending++
				d.bytes += r.size
			}
		}
		removed = removed || len(d.damaged) > 0
		if d.pending == 0 && d.bytes == 0 && !removed {
			return nil
		}
		// The stored counters, not the in-memory ones, are the base: after a
		// commit that failed at its fsync but whose pages did land, memory
		// is behind the file.
		wasEmpty := boltfile.Uint64(meta, keyPending) == 0
		if err := addPending(meta, int64(d.pending), d.bytes); err != nil {
			return err
		}
		if removed || wasEmpty {
			d.oldestKnown = true
			if _, v := records.Cursor().First(); v != nil {
				d.oldest, _ = enqueuedOf(v)
			}
		}
		return nil
	})
	return d, err
}

// append adds one entry inside tx, or settles it as a duplicate or conflict.
// It returns an *entryFailure if the transaction must be redone without it.
func (o *Outbox) append(tx *bolt.Tx, records, ids *bolt.Bucket, r *request, now time.Time, d *delta) error {
	e := r.entry
	id := []byte(e.EventID)
	var existing *Record
	if k := ids.Get(id); k != nil {
		k = append([]byte(nil), k...)
		seq := seqFromKey(k)
		v := records.Get(k)
		view, err := decodeRecord(k, v, false)
		if v != nil && err != nil {
			// The pending copy is damaged: move it aside, and this entry
			// takes its place as a new record.
			if err := o.setAsideIn(tx, k, err.Error(), d); err != nil {
				return err
			}
		}
		// An index entry whose record is gone (moved aside) is stale.
		if err == nil && (!bytes.Equal(view.topic, []byte(e.Topic)) || !o.samePayload(view.payload, e.Payload) || !o.sameProps(view.props, e.Props)) {
			o.settle(r, Record{}, fmt.Errorf("%w: event ID %q is already pending in outbox %s (seq %d) with a different topic, payload or properties; give the new message its own event ID",
				ErrEventIDConflict, e.EventID, o.path, seq))
			return nil
		}
		if err == nil {
			rec := view.record(seq)
			existing = &rec
		}
	}

	for _, p := range e.Participants {
		if err := runParticipant(p, tx); err != nil {
			if errors.Is(err, commit.ErrAlreadyApplied) {
				return &entryFailure{req: r, err: err, skip: true}
			}
			return &entryFailure{req: r, err: fmt.Errorf("outbox file %s: event %q not appended: a transaction participant failed: %w", o.path, e.EventID, err)}
		}
	}
	if existing != nil {
		r.rec, r.err = *existing, nil
		return nil
	}

	seq, err := records.NextSequence()
	if err != nil {
		return err
	}
	rec := Record{Seq: seq, Event: e.Event, Enqueued: time.Unix(0, now.UnixNano())}
	rec.Retained = false // not stored
	key := seqKey(seq)
	if err := records.Put(key, encodeRecord(&rec)); err != nil {
		return err
	}
	if err := ids.Put(id, key); err != nil {
		return err
	}
	r.rec, r.err, r.added = rec, nil, true
	return nil
}

// runParticipant turns a participant's panic into an error, so a bug in
// another component fails its entry instead of killing the committer.
func runParticipant(p func(*bolt.Tx) error, tx *bolt.Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("participant panicked: %v", r)
		}
	}()
	return p(tx)
}

// remove deletes the given records and their index entries inside tx.
//
// Invariant: this is the only code that deletes from outbox/records, and it
// runs only for Remove, which the sender calls after each record's
// confirmation. A record it cannot decode is not dropped: it is moved aside.
func (o *Outbox) remove(tx *bolt.Tx, seqs []uint64, d *delta) (n int, nbytes int64, err error) {
	// One seek per key, where Get then Delete would search the tree twice:
	// a cursor deletes where it stands, and a seek starts from the root, so
	// one cursor per bucket serves the whole loop.
	records, ids := tx.Bucket(bucketRecords).Cursor(), tx.Bucket(bucketIDs).Cursor()
	for _, seq := range seqs {
		key := seqKey(seq)
		v := seekExact(records, key)
		if v == nil {
			continue
		}
		view, err := decodeRecord(key, v, false)
		if err != nil {
			if err := o.setAsideIn(tx, key, err.Error(), d); err != nil {
				return 0, 0, err
			}
			continue
		}
		if k := seekExact(ids, view.eventID); k != nil && seqFromKey(k) == seq {
			if err := ids.Delete(); err != nil {
				return 0, 0, err
			}
		}
		nbytes += view.size()
		if err := records.Delete(); err != nil {
			return 0, 0, err
		}
		n++
	}
	return n, nbytes, nil
}

// seekExact moves c to key and returns its value, nil when key is absent
// (as Bucket.Get).
func seekExact(c *bolt.Cursor, key []byte) []byte {
	k, v := c.Seek(key)
	if !bytes.Equal(k, key) {
		return nil
	}
	return v
}

// setAsideIn moves one damaged record aside inside tx and counts it in d.
func (o *Outbox) setAsideIn(tx *bolt.Tx, key []byte, reason string, d *delta) error {
	rec, size, ok, err := o.moveAside(tx, key, reason)
	if err != nil || !ok {
		return err
	}
	d.pending--
	d.bytes -= size
	d.damaged = append(d.damaged, rec)
	return nil
}

func seqFromKey(k []byte) uint64 {
	if len(k) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(k)
}

// samePayload compares a pending record's payload with a write's.
func (o *Outbox) samePayload(stored, written []byte) bool {
	if o.opts.SamePayload != nil {
		return o.opts.SamePayload(stored, written)
	}
	return bytes.Equal(stored, written)
}

// sameProps compares a pending record's properties with a write's.
func (o *Outbox) sameProps(stored, written *mqttmsg.Properties) bool {
	if o.opts.SameProps != nil {
		return o.opts.SameProps(stored, written)
	}
	return bytes.Equal(encodeProps(stored), encodeProps(written))
}
