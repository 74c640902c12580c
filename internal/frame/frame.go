// Package frame is the frame format: several events in one PUBLISH, each
// with its own event ID, destination topic, payload, MQTT 5 user properties
// and trace context, optionally compressed with zstd. A frame is recognised
// by its first bytes (Is), so a receiver needs no setting to read one; its
// identity (ID) is derived from its events' IDs, so the one ACK that
// confirms it names exactly that set of events. docs/frames.md gives the
// format byte for byte; testdata/ holds its test vectors.
package frame

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// Magic starts every frame. 0xFF never occurs in UTF-8 text, so neither a
// reliomq v1 envelope ('{') nor any text payload starts with it.
const Magic = "\xffRMF"

// Version is the format version this package writes and the only one it
// reads; a frame of another version is refused (ErrMalformed).
const Version = 1

// Compression byte values (offset 5).
const (
	compNone = 0
	compZstd = 1
)

// The compression names Options.Compression takes.
const (
	None = "none"
	Zstd = "zstd"
)

// headerLen is magic, version and compression byte.
const headerLen = len(Magic) + 2

// Event is one event inside a frame.
type Event struct {
	ID         string            // event_id, reliomq rules (envelope.CheckEventID)
	Topic      string            // destination topic; "" when the hop's topic is fixed
	Payload    []byte            // opaque bytes
	Properties []Property        // MQTT 5 user properties, order kept (may be nil)
	Trace      map[string]string // W3C trace context (traceparent, tracestate), may be nil
}

// Property is one MQTT 5 user property.
type Property struct{ Key, Value string }

// Options is how Encode writes a frame.
type Options struct {
	Compression string // None ("" too) or Zstd
}

// Limits bound what Decode accepts.
type Limits struct {
	MaxEvents       int // refuse frames with more events
	MaxDecodedBytes int // refuse before expanding more than this (decompression bomb)
}

// MaxEvents is the most events a frame may hold; Encode refuses more.
const MaxEvents = 10000

// MaxDecodedBytes is the largest decoded body Encode writes and
// DefaultLimits accepts (its events' bytes, before compression).
const MaxDecodedBytes = 32 << 20

// DefaultLimits accept every frame Encode writes.
var DefaultLimits = Limits{MaxEvents: MaxEvents, MaxDecodedBytes: MaxDecodedBytes}

// ErrMalformed is wrapped by every error Decode returns, and by Encode's
// for events no frame can carry: such bytes never become a valid frame by
// retrying them.
var ErrMalformed = errors.New("frame: malformed frame")

type malformedError struct{ msg string }

func (e *malformedError) Error() string { return "frame: " + e.msg }
func (e *malformedError) Unwrap() error { return ErrMalformed }

func malformedf(format string, args ...any) error {
	return &malformedError{msg: fmt.Sprintf(format, args...)}
}

// Is reports whether b starts with the frame magic. A reliomq v1 envelope
// starts with '{', so the two never collide.
func Is(b []byte) bool { return len(b) >= len(Magic) && string(b[:len(Magic)]) == Magic }

// IDPrefix starts every frame ID.
const IDPrefix = "f-"

// ID is the frame's identity: "f-" and the lowercase hex of the first 16
// bytes of SHA-256 over the event IDs in order, each preceded by its length
// as a uvarint. A frame of other events, of the same events in another
// order, or of a part of them has another ID, so its ACK confirms exactly
// its own events. The ID is a valid reliomq event ID (34 characters).
func ID(eventIDs []string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, id := range eventIDs {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(id)))])
		h.Write([]byte(id))
	}
	sum := h.Sum(nil)
	return IDPrefix + hex.EncodeToString(sum[:16])
}
