package codec

import (
	"fmt"
	"strings"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
)

// What the output encodes, the input decodes back, for every mode.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	body := []byte(`{"n":1}`)
	for _, tc := range []struct {
		enc            Encoding
		decodeAs       string
		wantTopic      string
		wantDest       string
		payloadChanged bool
	}{
		{Encoding{Mode: None}, None, "a/b", "", false},
		{Encoding{Mode: Delivery}, Delivery, "a/b", "", true},
		{Encoding{Mode: None, EndToEnd: true, DataTopic: "data"}, Ingress, "data", "a/b", true},
		{Encoding{Mode: Properties}, Properties, "a/b", "", false},
		{Encoding{Mode: Properties, EndToEnd: true, DataTopic: "data"}, Properties, "data", "a/b", false},
	} {
		rec, err := tc.enc.Encode("evt-1", "a/b", body, nil)
		if err != nil {
			t.Fatalf("%+v: %v", tc.enc, err)
		}
		if rec.Topic != tc.wantTopic || rec.EventID != "evt-1" || (string(rec.Payload) != string(body)) != tc.payloadChanged {
			t.Errorf("%+v: record %+v", tc.enc, rec)
		}
		d := Decoding{Mode: tc.decodeAs}.Decode(rec.Topic, rec.Payload, rec.Props)
		if tc.decodeAs == None {
			if d.Err != nil || d.EventID != "" || string(d.Body) != string(body) {
				t.Errorf("none: decoded %+v", d)
			}
			continue
		}
		if d.Err != nil || d.EventID != "evt-1" || d.DestTopic != tc.wantDest || string(d.Body) != string(body) {
			t.Errorf("%+v decoded as %s: %+v", tc.enc, tc.decodeAs, d)
		}
	}
}

func TestMalformedNamesTopic(t *testing.T) {
	for _, mode := range []string{Ingress, Delivery, Properties} {
		d := Decoding{Mode: mode}.Decode("in/x", []byte("not json"), nil)
		if d.Err == nil || !strings.Contains(d.Err.Error(), `"in/x"`) || string(d.Body) != "not json" {
			t.Errorf("%s: %+v, want an error naming the topic and the payload as body", mode, d)
		}
	}
	if _, err := (Encoding{Mode: Delivery}).Encode("e", "t", []byte("not json"), nil); err == nil {
		t.Error("a non-JSON payload was enveloped")
	}
}

func TestEventIDAndTopicChecks(t *testing.T) {
	if _, err := EventID("null", "t"); err == nil || !strings.Contains(err.Error(), `"null"`) {
		t.Errorf("null accepted: %v", err)
	}
	if id, err := EventID("", "t"); err != nil || envelope.CheckEventID(id) != nil {
		t.Errorf("generated ID %q: %v", id, err)
	}
	if _, err := EventID("bad id!", "t"); err == nil {
		t.Error("an invalid event ID was accepted")
	}
	if err := CheckTopic("a/+"); err == nil || !strings.Contains(err.Error(), `"a/+"`) {
		t.Errorf("wildcard topic: %v", err)
	}
	e := Encoding{MaxPayloadBytes: 3}
	rec, _ := e.Encode("e", "t", []byte("1234"), nil)
	if err := e.CheckSize(rec, "t"); err == nil || !strings.Contains(err.Error(), "max_payload_bytes") {
		t.Errorf("oversized payload: %v", err)
	}
}

func TestAckPayload(t *testing.T) {
	plain, err := AckPayload("e1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := envelope.DecodeAck(plain); err != nil || id != "e1" {
		t.Errorf("plain ACK %s: %q %v", plain, id, err)
	}
	key := []byte("k")
	signed, err := AckPayload("e1", key)
	if err != nil {
		t.Fatal(err)
	}
	a, err := envelope.DecodeAuthAck(signed)
	if err != nil || !envelope.VerifyAck(a, [][]byte{key}) || envelope.VerifyAck(a, [][]byte{[]byte("other")}) {
		t.Errorf("signed ACK %s: %+v %v", signed, a, err)
	}
}

func TestPermanent(t *testing.T) {
	_, err := EventID("null", "t")
	p := Permanent(fmt.Errorf("wrapped: %w", err))
	if !IsPermanent(fmt.Errorf("outer: %w", p)) || IsPermanent(err) || !strings.HasPrefix(p.Error(), PermanentPrefix+"wrapped: ") {
		t.Errorf("Permanent(%v) = %v", err, p)
	}
}
