package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
)

const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func sample() []Event {
	return []Event{
		{ID: "e1", Topic: "plant/1/temp", Payload: []byte(`{"t":21.5}`),
			Properties: []Property{{"unit", "C"}, {"unit", "K"}, {"", ""}},
			Trace:      map[string]string{KeyTraceparent: tp, KeyTracestate: "k=v"}},
		{ID: "e2", Payload: nil},
		{ID: "e-3_x", Topic: "plant/ü", Payload: []byte{0, 0xff, 1}, Trace: map[string]string{KeyTraceparent: tp}},
	}
}

// normal is what Decode returns for events: nil for empty payloads and
// property lists, nil trace maps when empty.
func normal(events []Event) []Event {
	out := make([]Event, len(events))
	for i, e := range events {
		if len(e.Payload) == 0 {
			e.Payload = []byte{}
		}
		if len(e.Properties) == 0 {
			e.Properties = nil
		}
		if len(e.Trace) == 0 {
			e.Trace = nil
		}
		out[i] = e
	}
	return out
}

func TestEncodeDecodeRoundTripsBothCompressions(t *testing.T) {
	for _, c := range []string{None, Zstd} {
		b, id, err := Encode(sample(), Options{Compression: c})
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		if !Is(b) {
			t.Fatalf("%s: Is(frame) = false", c)
		}
		gotID, got, err := Decode(b, Limits{})
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		if gotID != id || id != ID([]string{"e1", "e2", "e-3_x"}) {
			t.Errorf("%s: ids %q %q", c, gotID, id)
		}
		if want := normal(sample()); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded\n%#v\nwant\n%#v", c, got, want)
		}
	}
}

func TestIDNamesExactlyOneOrderedSetOfEvents(t *testing.T) {
	a := ID([]string{"a", "b"})
	for _, other := range [][]string{{"b", "a"}, {"a"}, {"ab"}, {"a", "b", "c"}, {"", "ab"}} {
		if ID(other) == a {
			t.Errorf("ID(%q) == ID([a b])", other)
		}
	}
	if !strings.HasPrefix(a, IDPrefix) || len(a) != 34 || a != ID([]string{"a", "b"}) {
		t.Errorf("ID = %q", a)
	}
}

func TestIsRecognisesOnlyTheMagic(t *testing.T) {
	for _, b := range [][]byte{nil, []byte("{}"), []byte(`{"event_id":"a","version":1}`), []byte("\xffRM"), []byte("RMF\x01")} {
		if Is(b) {
			t.Errorf("Is(%q) = true", b)
		}
	}
}

func TestEncodeRefusesWhatDecodeWouldRefuse(t *testing.T) {
	big := make([]Event, MaxEvents+1)
	for i := range big {
		big[i].ID = "x"
	}
	cases := map[string][]Event{
		"no events":         nil,
		"too many":          big,
		"bad id":            {{ID: "a b"}},
		"empty id":          {{ID: ""}},
		"duplicate id":      {{ID: "a"}, {ID: "a"}},
		"wildcard topic":    {{ID: "a", Topic: "x/#"}},
		"property not utf8": {{ID: "a", Properties: []Property{{"k", "\xff"}}}},
		"property NUL":      {{ID: "a", Properties: []Property{{"k\x00", "v"}}}},
		"trace key":         {{ID: "a", Trace: map[string]string{"baggage": "x"}}},
		"bad traceparent":   {{ID: "a", Trace: map[string]string{KeyTraceparent: "00-x"}}},
		"state alone":       {{ID: "a", Trace: map[string]string{KeyTracestate: "k=v"}}},
	}
	for name, evs := range cases {
		if _, _, err := Encode(evs, Options{}); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
	if _, _, err := Encode(sample(), Options{Compression: "gzip"}); !errors.Is(err, ErrMalformed) {
		t.Errorf("unknown compression: %v", err)
	}
}

// frameOf builds a frame of body by hand (no compression).
func frameOf(body ...[]byte) []byte {
	b := append([]byte(Magic), Version, compNone)
	for _, p := range body {
		b = append(b, p...)
	}
	return b
}

func uv(v uint64) []byte  { return binary.AppendUvarint(nil, v) }
func str(s string) []byte { return append(uv(uint64(len(s))), s...) }

// event is one event's bytes: id, topic, no properties, no trace, payload.
func event(id, topic, payload string) []byte {
	return bytes.Join([][]byte{str(id), str(topic), uv(0), str(""), str(""), str(payload)}, nil)
}

func TestDecodeIsStrict(t *testing.T) {
	ok := frameOf(uv(1), event("a", "", "p"))
	if _, _, err := Decode(ok, Limits{}); err != nil {
		t.Fatalf("the hand-built frame is refused: %v", err)
	}
	cases := map[string][]byte{
		"empty":                {},
		"envelope":             []byte(`{"event_id":"a","version":1}`),
		"header cut":           []byte(Magic + "\x01"),
		"version 2":            append([]byte(Magic), 2, compNone, 1),
		"compression 7":        append([]byte(Magic), Version, 7, 1),
		"no events":            frameOf(uv(0)),
		"trailing byte":        append(append([]byte(nil), ok...), 0),
		"truncated payload":    ok[:len(ok)-1],
		"length past the end":  frameOf(uv(1), str("a"), str(""), uv(0), str(""), str(""), uv(5), []byte("p")),
		"overlong uvarint":     frameOf([]byte{0x81, 0x00}, event("a", "", "p")),
		"count beyond body":    frameOf(uv(1000), event("a", "", "p")),
		"bad event id":         frameOf(uv(1), event("a.b", "", "p")),
		"id too long":          frameOf(uv(1), event(strings.Repeat("a", 129), "", "p")),
		"duplicate event id":   frameOf(uv(2), event("a", "", "p"), event("a", "", "q")),
		"topic not utf8":       frameOf(uv(1), event("a", "t\xff", "p")),
		"topic wildcard":       frameOf(uv(1), event("a", "t/+", "p")),
		"property not utf8":    frameOf(uv(1), str("a"), str(""), uv(1), str("k"), str("\xc3"), str(""), str(""), str("")),
		"property count lies":  frameOf(uv(1), str("a"), str(""), uv(50), str("k"), str("v"), str(""), str(""), str("")),
		"tracestate alone":     frameOf(uv(1), str("a"), str(""), uv(0), str(""), str("k=v"), str("")),
		"traceparent invalid":  frameOf(uv(1), str("a"), str(""), uv(0), str("00-zz"), str(""), str("")),
		"zstd declares 0":      append([]byte(Magic), Version, compZstd, 0),
		"zstd not zstd":        append(append([]byte(Magic), Version, compZstd), append(uv(3), "abc"...)...),
		"uvarint cut in count": frameOf([]byte{0x80}),
	}
	for name, b := range cases {
		if _, _, err := Decode(b, Limits{}); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
}

func TestDecodeKeepsTheLimits(t *testing.T) {
	b, _, err := Encode(sample(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Decode(b, Limits{MaxEvents: 2}); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "outside 1 to 2") {
		t.Errorf("3 events under MaxEvents 2: %v", err)
	}
	if _, _, err := Decode(b, Limits{MaxDecodedBytes: len(b) - headerLen - 1}); !errors.Is(err, ErrMalformed) {
		t.Errorf("body one byte over MaxDecodedBytes: %v", err)
	}
	if _, _, err := Decode(b, Limits{MaxDecodedBytes: len(b) - headerLen}); err != nil {
		t.Errorf("body exactly MaxDecodedBytes: %v", err)
	}
	z, _, err := Encode(sample(), Options{Compression: Zstd})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Decode(z, Limits{MaxDecodedBytes: len(b) - headerLen - 1}); !errors.Is(err, ErrMalformed) {
		t.Errorf("zstd body one byte over MaxDecodedBytes: %v", err)
	}
	if _, _, err := Decode(z, Limits{MaxDecodedBytes: len(b) - headerLen}); err != nil {
		t.Errorf("zstd body exactly MaxDecodedBytes: %v", err)
	}
}
