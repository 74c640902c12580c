package envelope

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Authenticated ACKs (an opt-in extension of reliomq v1). Anyone who may
// publish on an ACK topic can otherwise retire a pending record that was
// never delivered. With a shared key the ACK gains
//
//	"auth": lowercase hex HMAC-SHA256(key, event_id)
//
// and a publisher counts an ACK only when auth verifies. It authenticates
// the sender of the ACK, not the broker: TLS and broker ACLs remain the
// first line. Without a key the ACK is the reliomq v1 bytes, unchanged.

// Ack is a decoded ACK. Auth is "" when the ACK carries none.
type Ack struct {
	EventID string
	Auth    string
}

// AckAuth returns the auth value of eventID's ACK under key.
func AckAuth(key []byte, eventID string) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(eventID))
	return hex.EncodeToString(mac.Sum(nil))
}

// EncodeAuthAck returns the canonical ACK for eventID with its auth under
// key: {"auth":"<hex>","event_id":"<id>","version":1}.
func EncodeAuthAck(eventID string, key []byte) ([]byte, error) {
	if err := CheckEventID(eventID); err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(eventID)+104)
	out = append(out, `{"auth":"`...)
	out = append(out, AckAuth(key, eventID)...)
	out = append(out, `","event_id":`...)
	out = appendString(out, eventID)
	out = append(out, `,"version":1}`...)
	return out, nil
}

// DecodeAuthAck strictly decodes an ACK with or without "auth".
func DecodeAuthAck(b []byte) (Ack, error) {
	fields, err := decodeMessage(b, "ACK", "?auth", "event_id", "version")
	if err != nil {
		return Ack{}, err
	}
	var a Ack
	if a.EventID, err = eventIDField(fields[1]); err != nil {
		return Ack{}, err
	}
	if auth := fields[0]; auth != nil {
		if auth.kind != kindString {
			return Ack{}, malformedf("auth must be a JSON string, got %s", auth.kind)
		}
		a.Auth = strings.Clone(auth.text) // not a view of the whole message
	}
	return a, nil
}

// VerifyAck reports whether a carries an auth that one of keys produced for
// its event ID. The comparison takes the same time wherever the values
// differ, so a forger learns nothing from timing.
func VerifyAck(a Ack, keys [][]byte) bool {
	ok := false
	for _, key := range keys {
		want := AckAuth(key, a.EventID)
		// hmac.Equal is constant-time for equal lengths; no early exit
		// across keys either.
		if hmac.Equal([]byte(want), []byte(a.Auth)) {
			ok = true
		}
	}
	return ok
}
