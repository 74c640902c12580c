package codec

import (
	"bytes"
	"errors"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
)

// Every envelope mode but none reads a frame by its magic, whatever the
// mode's own form; none leaves it opaque; ingress needs every event's
// destination topic.
func TestFrameIsReadInEveryEnvelopeModeButNone(t *testing.T) {
	events := []frame.Event{{ID: "a", Topic: "d/a", Payload: []byte("1")}, {ID: "b", Topic: "d/b", Payload: []byte("2")}}
	raw, id, err := frame.Encode(events, frame.Options{Compression: frame.Zstd})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{Ingress, Delivery, Properties} {
		dec := Decoding{Mode: mode}.Decode("in/x", raw, nil)
		if dec.Err != nil || dec.EventID != id || len(dec.Events) != 2 || dec.Events[1].Topic != "d/b" || dec.Body != nil {
			t.Errorf("%s: %+v", mode, dec)
		}
	}
	if dec := (Decoding{Mode: None}).Decode("in/x", raw, nil); dec.Events != nil || !bytes.Equal(dec.Body, raw) || dec.Err != nil {
		t.Errorf("none: %+v", dec)
	}
	noTopic, _, err := frame.Encode([]frame.Event{{ID: "a", Payload: []byte("1")}}, frame.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if dec := (Decoding{Mode: Ingress}).Decode("in/x", noTopic, nil); !errors.Is(dec.Err, frame.ErrMalformed) || dec.Events != nil {
		t.Errorf("ingress without topics: %+v", dec)
	}
	if dec := (Decoding{Mode: Delivery}).Decode("in/x", noTopic, nil); dec.Err != nil || len(dec.Events) != 1 {
		t.Errorf("delivery without topics: %+v", dec)
	}
}
