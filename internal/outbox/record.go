package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Record is one message waiting in the outbox for its confirmation.
type Record struct {
	Seq      uint64 // FIFO position, assigned by Append, strictly increasing, never reused
	EventID  string
	Topic    string
	Payload  []byte
	Enqueued time.Time
}

// size is what a record counts against MaxPendingBytes.
func size(eventID, topic string, payload []byte) int64 {
	return int64(len(eventID) + len(topic) + len(payload))
}

// Record values are stored as
//
//	version byte (1) | enqueued unix nanos (8, big-endian) |
//	uvarint len + event ID | uvarint len + topic | payload (the rest)
const (
	recordVersion = 1
	headerLen     = 1 + 8
)

func encodeRecord(r *Record) []byte {
	n := headerLen + 2*binary.MaxVarintLen64 + len(r.EventID) + len(r.Topic) + len(r.Payload)
	b := make([]byte, headerLen, n)
	b[0] = recordVersion
	binary.BigEndian.PutUint64(b[1:], uint64(r.Enqueued.UnixNano()))
	b = binary.AppendUvarint(b, uint64(len(r.EventID)))
	b = append(b, r.EventID...)
	b = binary.AppendUvarint(b, uint64(len(r.Topic)))
	b = append(b, r.Topic...)
	return append(b, r.Payload...)
}

// recordView is a decoded record whose slices still point into the stored
// value; it is valid only inside the transaction that read it.
type recordView struct {
	enqueued int64
	eventID  []byte
	topic    []byte
	payload  []byte
}

func (v *recordView) size() int64 {
	return int64(len(v.eventID) + len(v.topic) + len(v.payload))
}

// record copies the view out of the transaction's memory.
func (v *recordView) record(seq uint64) Record {
	return Record{
		Seq:      seq,
		EventID:  string(v.eventID),
		Topic:    string(v.topic),
		Payload:  append([]byte(nil), v.payload...),
		Enqueued: time.Unix(0, v.enqueued),
	}
}

var errShort = errors.New("value too short")

func decodeRecord(b []byte) (recordView, error) {
	var v recordView
	if len(b) < headerLen {
		return v, errShort
	}
	if b[0] != recordVersion {
		return v, fmt.Errorf("unknown record version %d", b[0])
	}
	v.enqueued = int64(binary.BigEndian.Uint64(b[1:]))
	rest := b[headerLen:]
	var err error
	if v.eventID, rest, err = lengthPrefixed(rest); err != nil {
		return v, fmt.Errorf("event ID: %w", err)
	}
	if v.topic, rest, err = lengthPrefixed(rest); err != nil {
		return v, fmt.Errorf("topic: %w", err)
	}
	v.payload = rest
	return v, nil
}

func lengthPrefixed(b []byte) (field, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, nil, errors.New("bad length")
	}
	b = b[k:]
	if n > uint64(len(b)) {
		return nil, nil, fmt.Errorf("length %d exceeds the %d bytes left", n, len(b))
	}
	return b[:n], b[n:], nil
}

// enqueuedOf reads only the enqueue time, for Stats.Oldest.
func enqueuedOf(b []byte) (time.Time, bool) {
	if len(b) < headerLen || b[0] != recordVersion {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(b[1:]))), true
}

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}
