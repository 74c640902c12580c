package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/format"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// Record is one event waiting in the outbox for its confirmation. The
// outbox stores no retain flag (Event.Retained is false): the sender
// publishes every record with the output's one setting.
type Record struct {
	Seq uint64 // FIFO position, assigned by Append, strictly increasing, never reused
	mqttmsg.Event
	Enqueued time.Time
}

// size is what a record counts against MaxPendingBytes: its event ID,
// topic, stored properties and payload.
func size(eventID, topic string, props []byte, payload []byte) int64 {
	return int64(len(eventID) + len(topic) + len(props) + len(payload))
}

// Record values are stored as
//
//	version byte (3) | enqueued unix nanos (8, big-endian) |
//	uvarint len + event ID | uvarint len + topic |
//	uvarint len + MQTT 5 properties (props.go; length 0: none) | payload |
//	CRC-32C (4, big-endian) of the seq key followed by every byte before it
//
// The checksum covers the key too, so a value that a damaged page shows
// under another key fails as well (boltfile.Checksum). A record without
// properties is written as version 2, which is the same without the
// properties field, byte for byte what was written before version 3
// existed, so an older binary still reads it. A version above 3 was written
// by a newer release: it is refused (newerRecord), never set aside as
// damage; the outbox's format marker (Format) says 3. A version-2 record
// may carry properties in its topic field (props.go, splitLegacyTopic); it
// is read as the record it always was. Version 1, written before
// checksums, is version 2 without the CRC; it is read only while upgrading
// a file (upgradeRecords), never after: in a checksummed outbox a version
// byte of 1 is damage.
const (
	recordVersionV1 = 1
	recordVersionV2 = 2
	recordVersion   = 3
	headerLen       = 1 + 8
	crcLen          = 4
)

// Format is the outbox format this build writes and the newest it reads.
const Format = recordVersion

func encodeRecord(r *Record) []byte {
	props := encodeProps(r.Props)
	n := headerLen + 3*binary.MaxVarintLen64 + len(r.EventID) + len(r.Topic) + len(props) + len(r.Payload) + crcLen
	b := make([]byte, headerLen, n)
	b[0] = recordVersionV2
	if props != nil {
		b[0] = recordVersion
	}
	binary.BigEndian.PutUint64(b[1:], uint64(r.Enqueued.UnixNano()))
	b = binary.AppendUvarint(b, uint64(len(r.EventID)))
	b = append(b, r.EventID...)
	b = binary.AppendUvarint(b, uint64(len(r.Topic)))
	b = append(b, r.Topic...)
	if props != nil {
		b = binary.AppendUvarint(b, uint64(len(props)))
		b = append(b, props...)
	}
	b = append(b, r.Payload...)
	return binary.BigEndian.AppendUint32(b, boltfile.Checksum(seqKey(r.Seq), b))
}

// recordView is a decoded record whose slices still point into the stored
// value; it is valid only inside the transaction that read it.
type recordView struct {
	enqueued int64
	eventID  []byte
	topic    []byte
	props    *mqttmsg.Properties // decoded: shares no memory with the value
	rawProps []byte              // as stored (version 3), or nil
	legacy   int                 // bytes of a version-2 topic field after the topic
	payload  []byte
}

// size is what the record counted against MaxPendingBytes when it was
// appended.
func (v *recordView) size() int64 {
	return int64(len(v.eventID) + len(v.topic) + len(v.rawProps) + v.legacy + len(v.payload))
}

// record copies the view out of the transaction's memory.
func (v *recordView) record(seq uint64) Record {
	return Record{
		Seq: seq,
		Event: mqttmsg.Event{
			EventID: string(v.eventID),
			Topic:   string(v.topic),
			Props:   v.props,
			Payload: append([]byte(nil), v.payload...),
		},
		Enqueued: time.Unix(0, v.enqueued),
	}
}

var (
	errShort    = errors.New("value too short")
	errChecksum = errors.New("checksum mismatch")
)

// decodeRecord checks a stored record against its key and checksum and
// decodes it. legacy accepts version 1 (no checksum), for the upgrade only.
func decodeRecord(key, b []byte, legacy bool) (recordView, error) {
	var v recordView
	if len(b) < headerLen {
		return v, errShort
	}
	version := b[0]
	switch {
	case version == recordVersion || version == recordVersionV2:
		if len(b) < headerLen+crcLen {
			return v, errShort
		}
		body := b[:len(b)-crcLen]
		if got, want := boltfile.Checksum(key, body), binary.BigEndian.Uint32(b[len(body):]); got != want {
			return v, fmt.Errorf("%w (stored %08x, computed %08x)", errChecksum, want, got)
		}
		b = body
	case version == recordVersionV1 && legacy:
	case version == recordVersionV1:
		return v, errors.New("record without a checksum in a checksummed outbox")
	case version > recordVersion:
		return v, fmt.Errorf("record version %d: %w", version, format.ErrNewer)
	default:
		return v, fmt.Errorf("unknown record version %d", version)
	}
	if len(key) != 8 {
		return v, fmt.Errorf("key of %d bytes, not a sequence number", len(key))
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
	if version == recordVersion {
		if v.rawProps, rest, err = lengthPrefixed(rest); err != nil {
			return v, fmt.Errorf("properties: %w", err)
		}
		if v.props, err = decodeProps(v.rawProps); err != nil {
			return v, fmt.Errorf("properties: %w", err)
		}
	} else {
		field := len(v.topic)
		if v.topic, v.props, err = splitLegacyTopic(v.topic); err != nil {
			return v, err
		}
		v.legacy = field - len(v.topic)
	}
	v.payload = rest
	return v, nil
}

// newerRecord returns a *format.NewerError if the record under key is of a
// version newer than this build reads, else nil.
func newerRecord(path string, key, v []byte) error {
	if len(v) == 0 {
		return nil
	}
	return format.Check(path, fmt.Sprintf("outbox record seq %d", seqFromKey(key)), uint64(v[0]), recordVersion)
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
	if len(b) < headerLen || (b[0] != recordVersion && b[0] != recordVersionV2 && b[0] != recordVersionV1) {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(b[1:]))), true
}

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}
