package codec

import (
	"errors"
	"slices"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// A stored event becomes, in a frame, what the receiver would deliver for
// it alone: its ID, destination topic, payload, user properties and trace
// context, and the topic of its frame.
func TestFrameEventCarriesWhatTheRecordCarries(t *testing.T) {
	user := &mqttmsg.Properties{User: []mqttmsg.UserProperty{{Key: "site", Value: "a"}, {Key: "traceparent", Value: tp}}}
	cases := []struct {
		name      string
		enc       Encoding
		trace     bool
		wantTopic string // of the event
		wantFrame string // the frame's topic
		wantProps []frame.Property
		wantTrace bool
	}{
		{"ingress", Encoding{Mode: None, EndToEnd: true, DataTopic: "data"}, false, "dest/1", "data", nil, false},
		{"traced ingress", Encoding{Mode: None, EndToEnd: true, DataTopic: "data", TraceContext: true}, true, "dest/1", "data", nil, true},
		{"delivery", Encoding{Mode: Delivery, TraceContext: true}, true, "", "dest/1", nil, true},
		{"properties end to end", Encoding{Mode: Properties, EndToEnd: true, DataTopic: "data"}, false, "dest/1", "data",
			[]frame.Property{{Key: "site", Value: "a"}, {Key: "traceparent", Value: tp}}, false},
		{"properties", Encoding{Mode: Properties}, false, "", "dest/1", []frame.Property{{Key: "site", Value: "a"}, {Key: "traceparent", Value: tp}}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.enc.MaxPayloadBytes = 1 << 20
			var extra *mqttmsg.Properties
			if c.enc.Mode == Properties {
				extra = user
			}
			ev, err := c.enc.Encode("e1", "dest/1", []byte(`{"n":1}`), extra)
			if err != nil {
				t.Fatal(err)
			}
			if c.trace {
				if _, err := c.enc.AddTraceContext(&ev, envelope.TraceContext{Traceparent: tp, Tracestate: "k=v"}); err != nil {
					t.Fatal(err)
				}
			}
			fe, topic, err := c.enc.FrameEvent(ev)
			if err != nil {
				t.Fatal(err)
			}
			if fe.ID != "e1" || fe.Topic != c.wantTopic || string(fe.Payload) != `{"n":1}` || topic != c.wantFrame {
				t.Fatalf("event %s topic %q payload %s in a frame to %q; want e1, %q, {\"n\":1}, %q", fe.ID, fe.Topic, fe.Payload, topic, c.wantTopic, c.wantFrame)
			}
			if !slices.Equal(fe.Properties, c.wantProps) {
				t.Fatalf("properties %v, want %v", fe.Properties, c.wantProps)
			}
			if got := fe.Trace[frame.KeyTraceparent] == tp && fe.Trace[frame.KeyTracestate] == "k=v"; got != c.wantTrace {
				t.Fatalf("trace %v, want it carried: %v", fe.Trace, c.wantTrace)
			}
		})
	}
}

// What a frame cannot carry rides alone: properties beyond user
// properties, a plain payload (envelope: none with confirm: broker), a
// record not in the encoding's form.
func TestFrameEventRefusesWhatAFrameCannotCarry(t *testing.T) {
	props := Encoding{Mode: Properties, MaxPayloadBytes: 1 << 20}
	ev, err := props.Encode("e1", "t", []byte("x"), &mqttmsg.Properties{ContentType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := props.FrameEvent(ev); !errors.Is(err, errNotPackable) {
		t.Fatalf("content type: %v, want not packable", err)
	}
	plain := Encoding{Mode: None, MaxPayloadBytes: 1 << 20}
	if plain.Packable() {
		t.Fatal("envelope: none with confirm: broker must not pack")
	}
	e2e := Encoding{Mode: None, EndToEnd: true, DataTopic: "d", MaxPayloadBytes: 1 << 20}
	if _, _, err := e2e.FrameEvent(mqttmsg.Event{EventID: "e1", Topic: "d", Payload: []byte("raw bytes")}); !errors.Is(err, errNotPackable) {
		t.Fatalf("a record that is not an envelope: %v, want not packable", err)
	}
}
