package outbox

import (
	"bytes"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
)

// AsideKind is what a set-aside record (outbox/damaged) is, judged by this
// build. Why it was set aside is not stored: the release that did it may
// have judged it by an older format (the release before record version 3
// set aside every version-3 record as "unknown").
type AsideKind int

const (
	// AsideReadable passes its checksum in a format this build reads:
	// Restore puts it back.
	AsideReadable AsideKind = iota
	// AsideChecksum fails its checksum: its bytes are damaged.
	AsideChecksum
	// AsideNewer is of a record version newer than this build reads.
	AsideNewer
	// AsideUnreadable passes no check this build can make otherwise
	// (a version byte no release wrote, a field that overruns the value).
	AsideUnreadable
)

func (k AsideKind) String() string {
	switch k {
	case AsideReadable:
		return "readable"
	case AsideChecksum:
		return "checksum"
	case AsideNewer:
		return "newer format"
	}
	return "unreadable"
}

// AsideRecord is one record in outbox/damaged. It was never published.
type AsideRecord struct {
	Seq    uint64 // 0 if the key is not a sequence number
	Size   int    // bytes of the stored value
	Kind   AsideKind
	Reason string // what this build finds, in words
	Record Record // decoded, when Kind is AsideReadable
}

// judge decodes a set-aside value and says what it is.
func judge(k, v []byte) AsideRecord {
	a := AsideRecord{Seq: seqFromKey(k), Size: len(v)}
	view, err := decodeRecord(k, v, false)
	switch {
	case err == nil:
		a.Kind, a.Record = AsideReadable, view.record(a.Seq)
		a.Reason = fmt.Sprintf("passes its checksum; record version %d, which this build reads: `outbox restore` puts it back", v[0])
	case errors.Is(err, errChecksum):
		a.Kind, a.Reason = AsideChecksum, "fails its checksum: "+err.Error()
	case format.IsNewer(err):
		a.Kind, a.Reason = AsideNewer, fmt.Sprintf("record version %d, newer than this build reads (1 to %d): run the release that wrote it, or a newer one", v[0], recordVersion)
	default:
		a.Kind, a.Reason = AsideUnreadable, err.Error()
	}
	return a
}

// EachAside calls fn with every set-aside record, in sequence order, until
// fn returns an error (which EachAside returns). Read-only.
func EachAside(tx *bolt.Tx, path string, fn func(AsideRecord) error) error {
	if _, _, err := buckets(tx, path); err != nil {
		return err
	}
	b := tx.Bucket(bucketDamaged)
	if b == nil {
		return nil
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if err := fn(judge(k, v)); err != nil {
			return err
		}
	}
	return nil
}

// Restored is what Restore did.
type Restored struct {
	Seqs []uint64 // put back, in order
	// Kept are the records left set aside, with why; an AsideReadable one
	// among them has its event ID pending again under another seq.
	Kept []AsideRecord
}

// Restore puts every set-aside record that passes its checksum in a format
// this build reads back into the queue under its original sequence
// number, in one transaction, so it is sent in its FIFO place; the rest
// stays set aside. It opens the file itself, so the file's lock refuses it
// while another process (a running output) holds it: a running sender has
// read past those sequence numbers and would not see them.
func Restore(path string) (Restored, error) {
	var r Restored
	o, err := Open(path, Options{})
	if err != nil {
		return r, fmt.Errorf("restoring set-aside records: %w; nothing restored", err)
	}
	err = o.file.Update(func(tx *bolt.Tx) error {
		r = Restored{}
		return restoreIn(tx, o.path, &r)
	})
	if cerr := o.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Restored{}, fmt.Errorf("outbox file %s: restoring set-aside records: %w; nothing restored", path, err)
	}
	return r, nil
}

func restoreIn(tx *bolt.Tx, path string, r *Restored) error {
	records, ids, meta := tx.Bucket(bucketRecords), tx.Bucket(bucketIDs), tx.Bucket(bucketMeta)
	aside := tx.Bucket(bucketDamaged)
	if aside == nil {
		return nil
	}
	type kv struct{ k, v []byte }
	var all []kv
	c := aside.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		all = append(all, kv{bytes.Clone(k), bytes.Clone(v)})
	}
	var n, nbytes int64
	for _, e := range all {
		a := judge(e.k, e.v)
		if a.Kind != AsideReadable {
			r.Kept = append(r.Kept, a)
			continue
		}
		id := []byte(a.Record.EventID)
		// The index may still name this seq (a set-aside leaves it), or a
		// record appended since with the same event ID: that one is the
		// pending copy, and this one stays aside.
		if k := ids.Get(id); k != nil && !bytes.Equal(k, e.k) && records.Get(k) != nil {
			a.Reason = fmt.Sprintf("its event ID %s is pending again as seq %d", a.Record.EventID, seqFromKey(k))
			r.Kept = append(r.Kept, a)
			continue
		}
		if records.Get(e.k) != nil {
			a.Reason = fmt.Sprintf("seq %d is pending too, with other bytes", a.Seq)
			r.Kept = append(r.Kept, a)
			continue
		}
		view, _ := decodeRecord(e.k, e.v, false)
		if err := records.Put(e.k, e.v); err != nil {
			return err
		}
		if err := ids.Put(id, e.k); err != nil {
			return err
		}
		if err := aside.Delete(e.k); err != nil {
			return err
		}
		n++
		nbytes += view.size()
		r.Seqs = append(r.Seqs, a.Seq)
	}
	if n == 0 {
		return nil
	}
	left := int64(boltfile.Uint64(meta, keyDamaged)) - n
	if err := boltfile.PutUint64(meta, keyDamaged, uint64(max(left, 0))); err != nil {
		return err
	}
	return addPending(meta, n, nbytes)
}
