package envelope

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// goldenVector is one entry of testdata/golden.json, written by
// testdata/gen_golden.py with Python's json module (reliomq's encoder).
type goldenVector struct {
	Name             string  `json:"name"`
	Message          string  `json:"message"` // ingress, delivery or ack
	EventID          string  `json:"event_id"`
	Topic            *string `json:"topic"`
	Payload          string  `json:"payload"`           // as handed to the encoder
	PayloadCanonical *string `json:"payload_canonical"` // Python's canonical form
	WireIn           *string `json:"wire_in"`           // decode-only vectors: non-canonical input
	Wire             string  `json:"wire"`              // exact bytes reliomq sends
}

func loadGolden(t testing.TB) []goldenVector {
	t.Helper()
	raw, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatalf("reading golden vectors: %v", err)
	}
	var vs []goldenVector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatalf("parsing testdata/golden.json: %v", err)
	}
	if len(vs) < 30 {
		t.Fatalf("testdata/golden.json has only %d vectors", len(vs))
	}
	return vs
}

func TestEncodeProducesReliomqBytesExactly(t *testing.T) {
	for _, v := range loadGolden(t) {
		if v.WireIn != nil {
			continue // decode-only vector
		}
		t.Run(v.Name, func(t *testing.T) {
			var got []byte
			var err error
			switch v.Message {
			case "ingress":
				got, err = EncodeIngress(v.EventID, *v.Topic, []byte(v.Payload))
			case "delivery":
				got, err = EncodeDelivery(v.EventID, []byte(v.Payload))
			case "ack":
				got, err = EncodeAck(v.EventID)
			default:
				t.Fatalf("unknown message kind %q", v.Message)
			}
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if string(got) != v.Wire {
				t.Fatalf("encode:\n got %s\nwant %s", got, v.Wire)
			}
			if v.PayloadCanonical != nil {
				canon, err := Canonical([]byte(v.Payload))
				if err != nil || string(canon) != *v.PayloadCanonical {
					t.Fatalf("Canonical(%q) = %q, %v; want %q", v.Payload, canon, err, *v.PayloadCanonical)
				}
			}
		})
	}
}

func TestDecodeGoldenBytesAndReencodeIdentically(t *testing.T) {
	for _, v := range loadGolden(t) {
		t.Run(v.Name, func(t *testing.T) {
			in := []byte(v.Wire)
			if v.WireIn != nil {
				in = []byte(*v.WireIn)
			}
			var again []byte
			var err error
			switch v.Message {
			case "ingress":
				var m Ingress
				if m, err = DecodeIngress(in); err != nil {
					t.Fatalf("decode %q: %v", in, err)
				}
				if m.EventID != v.EventID || m.Topic != *v.Topic || string(m.Payload) != *v.PayloadCanonical {
					t.Fatalf("decoded %+v (payload %s); want event_id %q topic %q payload %s", m, m.Payload, v.EventID, *v.Topic, *v.PayloadCanonical)
				}
				again, err = EncodeIngress(m.EventID, m.Topic, m.Payload)
			case "delivery":
				var m Delivery
				if m, err = DecodeDelivery(in); err != nil {
					t.Fatalf("decode %q: %v", in, err)
				}
				if m.EventID != v.EventID || string(m.Payload) != *v.PayloadCanonical {
					t.Fatalf("decoded %+v (payload %s); want event_id %q payload %s", m, m.Payload, v.EventID, *v.PayloadCanonical)
				}
				again, err = EncodeDelivery(m.EventID, m.Payload)
			case "ack":
				var id string
				if id, err = DecodeAck(in); err != nil {
					t.Fatalf("decode %q: %v", in, err)
				}
				if id != v.EventID {
					t.Fatalf("decoded event_id %q, want %q", id, v.EventID)
				}
				again, err = EncodeAck(id)
			}
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			if string(again) != v.Wire {
				t.Fatalf("round trip:\n got %s\nwant %s", again, v.Wire)
			}
		})
	}
}

// Each message kind rejects the other kinds: the key sets differ.
func TestMessageKindsDoNotDecodeAsEachOther(t *testing.T) {
	ingress, _ := EncodeIngress("e1", "t", []byte(`1`))
	delivery, _ := EncodeDelivery("e1", []byte(`1`))
	ack, _ := EncodeAck("e1")
	if _, err := DecodeIngress(delivery); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), `missing key(s) "topic"`) {
		t.Errorf("DecodeIngress(delivery) error = %v", err)
	}
	if _, err := DecodeDelivery(ingress); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), `unknown key(s) "topic"`) {
		t.Errorf("DecodeDelivery(ingress) error = %v", err)
	}
	if _, err := DecodeAck(delivery); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), `unknown key(s) "payload"`) {
		t.Errorf("DecodeAck(delivery) error = %v", err)
	}
	if _, err := DecodeDelivery(ack); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), `missing key(s) "payload"`) {
		t.Errorf("DecodeDelivery(ack) error = %v", err)
	}
}

// ingressWith builds ingress envelope text around a raw payload.
func ingressWith(payload string) string {
	return `{"event_id":"e1","payload":` + payload + `,"topic":"t","version":1}`
}

func TestDecodeRejectsWhatReliomqRejects(t *testing.T) {
	deep := strings.Repeat("[", MaxPayloadDepth+1) + strings.Repeat("]", MaxPayloadDepth+1)
	cases := []struct {
		rule    string
		decode  string // ingress, delivery or ack
		in      string
		wantErr string
	}{
		// Bytes and syntax.
		{"invalid UTF-8 byte", "ingress", ingressWith("\"\xff\""), "invalid UTF-8 at offset 28"},
		{"overlong UTF-8", "ingress", ingressWith("\"\xc0\xaf\""), "invalid UTF-8"},
		{"UTF-8-encoded surrogate", "ingress", ingressWith("\"\xed\xa0\x80\""), "invalid UTF-8"},
		{"byte order mark", "ack", "\uFEFF" + `{"event_id":"a","version":1}`, "byte order mark is not allowed"},
		{"empty input", "ack", "", "no JSON value"},
		{"only whitespace", "ack", " \n", "no JSON value"},
		{"truncated", "ack", `{"event_id":"a","version":1`, "unexpected end of input"},
		{"two values", "ack", `{"event_id":"a","version":1}{}`, "extra data after the JSON value at offset 28"},
		{"trailing garbage", "ack", `{"event_id":"a","version":1} x`, "extra data"},
		{"non-JSON whitespace (form feed)", "ack", "\f" + `{"event_id":"a","version":1}`, "expecting a JSON value"},
		{"non-JSON whitespace (NBSP)", "ack", `{"event_id":"a",` + "\u00a0" + `"version":1}`, "expecting a double-quoted object key"},
		{"trailing comma in object", "ack", `{"event_id":"a","version":1,}`, "expecting a double-quoted object key"},
		{"trailing comma in array", "ingress", ingressWith(`[1,]`), "expecting a JSON value"},
		{"single-quoted string", "ingress", ingressWith(`'x'`), "expecting a JSON value"},
		{"unquoted key", "ingress", ingressWith(`{a:1}`), "expecting a double-quoted object key"},
		{"comment", "ingress", ingressWith(`/*x*/1`), "expecting a JSON value"},
		{"raw control character in string", "ingress", ingressWith("\"a\tb\""), "unescaped control character"},
		{"invalid escape", "ingress", ingressWith(`"\x41"`), `invalid escape "\\x"`},
		{"short \\u escape", "ingress", ingressWith(`"\u12"`), `invalid \uXXXX escape`},
		{"leading zero", "ingress", ingressWith(`01`), "expecting ',' or '}'"},
		{"bare minus", "ingress", ingressWith(`-`), "expecting a digit"},
		{"fraction without digits", "ingress", ingressWith(`1.`), "after the decimal point"},
		{"leading dot", "ingress", ingressWith(`.5`), "expecting a JSON value"},
		{"exponent without digits", "ingress", ingressWith(`1e+`), "in the exponent"},
		{"plus sign", "ingress", ingressWith(`+1`), "expecting a JSON value"},
		{"Python literal True", "ingress", ingressWith(`True`), "expecting a JSON value"},
		{"non-ASCII digit", "ingress", ingressWith("\u0661"), "expecting a JSON value"},
		{"nesting deeper than MaxPayloadDepth", "ingress", ingressWith(deep), "payload nests arrays and objects more than 900 levels deep at offset 927"},

		// Strictness beyond syntax.
		{"duplicate top-level key", "ack", `{"event_id":"a","event_id":"b","version":1}`, `duplicate key "event_id" at offset 16`},
		{"duplicate key written with an escape", "ack", `{"event_id":"a","\u0065vent_id":"b","version":1}`, `duplicate key "event_id"`},
		{"duplicate key deep in payload", "ingress", ingressWith(`[{"x":[{"k":1,"j":2,"k":3}]}]`), `duplicate key "k"`},
		{"NaN", "ingress", ingressWith(`NaN`), "NaN is not allowed at offset 27"},
		{"Infinity", "ingress", ingressWith(`[Infinity]`), "Infinity is not allowed"},
		{"-Infinity", "ingress", ingressWith(`{"a":-Infinity}`), "-Infinity is not allowed"},
		{"float overflow 1e400", "ingress", ingressWith(`1e400`), "number 1e400 overflows to infinity"},
		{"float overflow -1.8e308", "ingress", ingressWith(`[-1.8e308]`), "overflows to infinity"},
		{"integer longer than 4300 digits", "ingress", ingressWith("-" + strings.Repeat("7", 4301)), "integer has 4301 digits"},
		{"unpaired high surrogate", "ingress", ingressWith(`"\ud800"`), `unpaired UTF-16 surrogate \ud800`},
		{"unpaired low surrogate", "ingress", ingressWith(`"x\udc00"`), `unpaired UTF-16 surrogate \udc00`},
		{"surrogates in the wrong order", "ingress", ingressWith(`"\ude00\ud83d"`), `unpaired UTF-16 surrogate \ude00`},
		{"high surrogate followed by a non-surrogate escape", "ingress", ingressWith(`"\ud83d\u0041"`), `unpaired UTF-16 surrogate \ud83d`},
		{"unpaired surrogate in a key", "ingress", ingressWith(`{"\uDBFF":1}`), `unpaired UTF-16 surrogate \udbff`},

		// Message shape.
		{"top level is an array", "ack", `[{"event_id":"a","version":1}]`, "ACK must be a JSON object, got array"},
		{"top level is a string", "delivery", `"x"`, "delivery envelope must be a JSON object, got string"},
		{"missing key", "ingress", `{"event_id":"e1","payload":1,"version":1}`, `ingress envelope has missing key(s) "topic"`},
		{"unknown key", "ack", `{"event_id":"a","qos":1,"version":1}`, `ACK has unknown key(s) "qos"`},
		{"missing and unknown key", "delivery", `{"event_id":"a","payload":1,"Version":1}`, `missing key(s) "version" and unknown key(s) "Version"`},
		{"empty object", "ack", `{}`, `missing key(s) "event_id", "version"`},

		// version.
		{"version 1.0", "ack", `{"event_id":"a","version":1.0}`, "version must be the integer 1, got 1.0"},
		{"version 1e0", "ack", `{"event_id":"a","version":1e0}`, "version must be the integer 1, got 1.0"},
		{"version true", "ack", `{"event_id":"a","version":true}`, "got true"},
		{"version string", "ack", `{"event_id":"a","version":"1"}`, `got "1"`},
		{"version 2", "ack", `{"event_id":"a","version":2}`, "got 2"},
		{"version null", "ack", `{"event_id":"a","version":null}`, "got null"},

		// event_id.
		{"event_id not a string", "ack", `{"event_id":12,"version":1}`, "event_id must be a JSON string, got number"},
		{"event_id empty", "ack", `{"event_id":"","version":1}`, `event_id "" does not match ^[A-Za-z0-9_-]{1,128}$`},
		{"event_id with space", "ack", `{"event_id":"a b","version":1}`, `event_id "a b" does not match`},
		{"event_id with trailing newline", "ack", `{"event_id":"ab\n","version":1}`, `event_id "ab\n" does not match`},
		{"event_id non-ASCII", "ack", `{"event_id":"caf\u00e9","version":1}`, `event_id "café" does not match`},
		{"event_id 129 characters", "ack", `{"event_id":"` + strings.Repeat("a", 129) + `","version":1}`, "(129 bytes) does not match"},

		// topic.
		{"topic not a string", "ingress", `{"event_id":"e","payload":1,"topic":["t"],"version":1}`, "topic must be a JSON string, got array"},
		{"topic empty", "ingress", `{"event_id":"e","payload":1,"topic":"","version":1}`, "topic is empty"},
		{"topic with NUL", "ingress", `{"event_id":"e","payload":1,"topic":"a\u0000b","version":1}`, `topic "a\x00b" contains NUL`},
		{"topic with +", "ingress", `{"event_id":"e","payload":1,"topic":"a/+/b","version":1}`, "MQTT wildcard"},
		{"topic with #", "ingress", `{"event_id":"e","payload":1,"topic":"a/#","version":1}`, "MQTT wildcard"},
		{"topic over 65535 bytes", "ingress", `{"event_id":"e","payload":1,"topic":"` + strings.Repeat("é", 32768) + `","version":1}`, "topic is 65536 bytes; MQTT allows at most 65535"},
		{"topic with unpaired surrogate", "ingress", `{"event_id":"e","payload":1,"topic":"a\udfff","version":1}`, "unpaired UTF-16 surrogate"},
	}
	for _, c := range cases {
		t.Run(c.rule, func(t *testing.T) {
			var err error
			switch c.decode {
			case "ingress":
				_, err = DecodeIngress([]byte(c.in))
			case "delivery":
				_, err = DecodeDelivery([]byte(c.in))
			case "ack":
				_, err = DecodeAck([]byte(c.in))
			}
			if err == nil {
				t.Fatalf("accepted %q", c.in)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("error %v does not wrap ErrMalformed", err)
			}
			if !strings.HasPrefix(err.Error(), "envelope: ") || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("error %q does not say %q", err, c.wantErr)
			}
		})
	}
}

// The limits are inclusive: the largest allowed value of each decodes.
func TestDecodeAcceptsValuesAtTheLimits(t *testing.T) {
	deepest := strings.Repeat("[", MaxPayloadDepth) + strings.Repeat("]", MaxPayloadDepth)
	longestInt := strings.Repeat("9", maxIntDigits)
	longestTopic := strings.Repeat("é", 32767) + "x" // 65535 bytes
	longestID := strings.Repeat("Z", MaxEventIDLen)
	m, err := DecodeIngress([]byte(`{"event_id":"` + longestID + `","payload":[` + longestInt + `,1e308,1e-400,"\ud83d\ude00\u0000"],"topic":"` + longestTopic + `","version":1}`))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	want := `[` + longestInt + ",1e+308,0.0,\"😀\\u0000\"]"
	if m.EventID != longestID || m.Topic != longestTopic || string(m.Payload) != want {
		t.Fatalf("decoded event_id %q topic (%d bytes) payload %.80q...", m.EventID, len(m.Topic), m.Payload)
	}
	d, err := DecodeDelivery([]byte(`{"event_id":"e","payload":` + deepest + `,"version":1}`))
	if err != nil || string(d.Payload) != deepest {
		t.Fatalf("decoding a payload nested %d levels: %v", MaxPayloadDepth, err)
	}
	if _, err := Canonical([]byte(deepest)); err != nil {
		t.Fatalf("Canonical of a payload nested %d levels: %v", MaxPayloadDepth, err)
	}
	if _, err := Canonical([]byte("[" + deepest + "]")); err == nil {
		t.Fatalf("Canonical accepted a payload nested %d levels", MaxPayloadDepth+1)
	}
}

func TestEncodeRejectsWhatCannotBeSent(t *testing.T) {
	cases := []struct {
		rule    string
		encode  func() ([]byte, error)
		wantErr string
	}{
		{"ingress event_id invalid", func() ([]byte, error) { return EncodeIngress("a/b", "t", []byte(`1`)) }, `event_id "a/b" does not match`},
		{"delivery event_id empty", func() ([]byte, error) { return EncodeDelivery("", []byte(`1`)) }, `event_id "" does not match`},
		{"ack event_id too long", func() ([]byte, error) { return EncodeAck(strings.Repeat("x", 129)) }, "(129 bytes) does not match"},
		{"topic wildcard", func() ([]byte, error) { return EncodeIngress("e", "a/#", []byte(`1`)) }, "MQTT wildcard"},
		{"topic not UTF-8", func() ([]byte, error) { return EncodeIngress("e", "a\xffb", []byte(`1`)) }, "not valid UTF-8"},
		{"topic empty", func() ([]byte, error) { return EncodeIngress("e", "", []byte(`1`)) }, "topic is empty"},
		{"payload empty", func() ([]byte, error) { return EncodeDelivery("e", nil) }, "payload is not strict JSON: no JSON value (empty input) at offset 0"},
		{"payload not JSON", func() ([]byte, error) { return EncodeIngress("e", "t", []byte(`hello`)) }, `payload is not strict JSON: invalid character 'h', expecting a JSON value at offset 0`},
		{"payload NaN", func() ([]byte, error) { return EncodeIngress("e", "t", []byte(`{"temperature": NaN}`)) }, "payload is not strict JSON: NaN is not allowed at offset 16"},
		{"payload overflow", func() ([]byte, error) { return EncodeDelivery("e", []byte(`[1e999]`)) }, "number 1e999 overflows to infinity at offset 1"},
		{"payload duplicate key", func() ([]byte, error) { return EncodeDelivery("e", []byte(`{"a":1,"a":2}`)) }, `duplicate key "a" at offset 7`},
		{"payload binary", func() ([]byte, error) { return EncodeDelivery("e", []byte{0x89, 'P', 'N', 'G'}) }, "invalid UTF-8 at offset 0"},
		{"payload two values", func() ([]byte, error) { return EncodeDelivery("e", []byte(`1 2`)) }, "extra data after the JSON value at offset 2"},
	}
	for _, c := range cases {
		t.Run(c.rule, func(t *testing.T) {
			out, err := c.encode()
			if err == nil {
				t.Fatalf("encoded %q", out)
			}
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("error %q does not wrap ErrMalformed and say %q", err, c.wantErr)
			}
		})
	}
}

func TestCanonicalFloatsMatchPythonRepr(t *testing.T) {
	// Python: repr(float(text)). The boundaries of fixed notation are
	// 1e-4 (fixed) / 1e-5 (scientific) and below 1e16 (fixed) / 1e16.
	cases := map[string]string{
		"25.2": "25.2", "1.0": "1.0", "1": "1", "100.0": "100.0", "1e2": "100.0",
		"0.0001": "0.0001", "0.00001": "1e-05", "0.000123": "0.000123", "0.0000123": "1.23e-05",
		"1e15": "1000000000000000.0", "9999999999999998.0": "9999999999999998.0", "1e16": "1e+16",
		"12345678901234567.0": "1.2345678901234568e+16", "-0.0": "-0.0", "0.0": "0.0", "-0": "0",
		"0e-5": "0.0", "-1e-400": "-0.0", "1.5e300": "1.5e+300", "5e-324": "5e-324", "1e-7": "1e-07",
		"1.7976931348623157e308": "1.7976931348623157e+308", "0.1": "0.1", "0.30000000000000004": "0.30000000000000004",
		"123456789012345678901234567890": "123456789012345678901234567890", "-123.0e-2": "-1.23",
	}
	for in, want := range cases {
		got, err := Canonical([]byte(in))
		if err != nil || string(got) != want {
			t.Errorf("Canonical(%s) = %s, %v; want %s", in, got, err, want)
		}
	}
}

func TestCanonicalEscapesOnlyWhatPythonEscapes(t *testing.T) {
	var in, want strings.Builder
	in.WriteString(`"`)
	want.WriteString(`"`)
	for c := 0; c < 0x20; c++ {
		in.WriteString(`\u00` + hex.EncodeToString([]byte{byte(c)}))
	}
	in.WriteString(`\"\\\/<>&` + "\x7f\u00e9\u2028\u2029\U0010FFFF" + `"`)
	want.WriteString(`\u0000\u0001\u0002\u0003\u0004\u0005\u0006\u0007\b\t\n\u000b\f\r\u000e\u000f` +
		`\u0010\u0011\u0012\u0013\u0014\u0015\u0016\u0017\u0018\u0019\u001a\u001b\u001c\u001d\u001e\u001f`)
	want.WriteString(`\"\\/<>&` + "\x7f\u00e9\u2028\u2029\U0010FFFF" + `"`)
	got, err := Canonical([]byte(in.String()))
	if err != nil || string(got) != want.String() {
		t.Fatalf("Canonical:\n got %q, %v\nwant %q", got, err, want.String())
	}
}

func TestNewEventIDIsAnIncreasingUUID7Hex(t *testing.T) {
	seen := map[string]bool{}
	prev := ""
	before := time.Now().UnixMilli()
	for i := 0; i < 10000; i++ {
		id := NewEventID()
		if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
			t.Fatalf("NewEventID() = %q, want 32 lowercase hex digits", id)
		}
		if id[12] != '7' || !strings.ContainsRune("89ab", rune(id[16])) {
			t.Fatalf("NewEventID() = %q is not a version 7 UUID", id)
		}
		if err := CheckEventID(id); err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			t.Fatalf("NewEventID() repeated %q", id)
		}
		if id <= prev {
			t.Fatalf("NewEventID() = %q after %q: not increasing", id, prev)
		}
		seen[id], prev = true, id
	}
	ms, err := strconv.ParseInt(prev[:12], 16, 64)
	if err != nil || ms < before || ms > time.Now().UnixMilli() {
		t.Fatalf("NewEventID() = %q: timestamp %d (%v) not within the test's run [%d, now]", prev, ms, err, before)
	}
}

func TestNewRandomIDIsAFreshUUID4Hex(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := NewRandomID()
		if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
			t.Fatalf("NewRandomID() = %q, want 32 lowercase hex digits", id)
		}
		if id[12] != '4' || !strings.ContainsRune("89ab", rune(id[16])) {
			t.Fatalf("NewRandomID() = %q is not a version 4 UUID", id)
		}
		if seen[id] {
			t.Fatalf("NewRandomID() repeated %q", id)
		}
		seen[id] = true
	}
}

// FuzzDecodeIngress checks that decoding never panics, that every error
// wraps ErrMalformed, that whatever decodes re-encodes to bytes that decode
// to the same message, and that accepted input is valid JSON to an
// independent parser (encoding/json).
func FuzzDecodeIngress(f *testing.F) {
	for _, v := range loadGolden(f) {
		if v.Message == "ingress" {
			f.Add([]byte(v.Wire))
			if v.WireIn != nil {
				f.Add([]byte(*v.WireIn))
			}
		}
	}
	for _, s := range []string{
		ingressWith(`NaN`), ingressWith(`"\ud800"`), ingressWith(`{"a":1,"a":2}`), ingressWith(`1e400`),
		`{"event_id":"e","payload":1,"topic":"a/+","version":1}`, `{"event_id":"e","payload":1,"topic":"t","version":1.0}`,
		"{\"event_id\":\"e\",\"payload\":\"\xff\",\"topic\":\"t\",\"version\":1}", `[]`, ``, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeIngress(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if !json.Valid(b) {
			t.Fatalf("accepted %q, which encoding/json says is not JSON", b)
		}
		canon, err := Canonical(m.Payload)
		if err != nil || !bytes.Equal(canon, m.Payload) {
			t.Fatalf("decoded payload %q is not canonical: Canonical = %q, %v", m.Payload, canon, err)
		}
		wire, err := EncodeIngress(m.EventID, m.Topic, m.Payload)
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", m, err)
		}
		again, err := DecodeIngress(wire)
		if err != nil {
			t.Fatalf("decoding re-encoded %q: %v", wire, err)
		}
		if again.EventID != m.EventID || again.Topic != m.Topic || !bytes.Equal(again.Payload, m.Payload) {
			t.Fatalf("round trip changed the message: %+v -> %+v", m, again)
		}
	})
}

// An authenticated ACK carries HMAC-SHA256(key, event_id) in lowercase hex
// (the vector is Python's hmac.new(b"k1", b"evt-1", sha256).hexdigest());
// it verifies under its key or a rotation list holding it, and under no
// other key, with a changed event ID, or without auth. A plain ACK is
// unchanged and decodes with an empty Auth.
func TestAuthenticatedAck(t *testing.T) {
	const want = `{"auth":"282e7dc08146d0948b5e9e3023fce4768b6ef30da724b5e9177835495f2831d8","event_id":"evt-1","version":1}`
	b, err := EncodeAuthAck("evt-1", []byte("k1"))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Fatalf("EncodeAuthAck = %s\nwant           %s", b, want)
	}
	a, err := DecodeAuthAck(b)
	if err != nil {
		t.Fatal(err)
	}
	k1, k2 := []byte("k1"), []byte("k2")
	if !VerifyAck(a, [][]byte{k1}) || !VerifyAck(a, [][]byte{k2, k1}) {
		t.Fatal("a correct auth did not verify")
	}
	if VerifyAck(a, [][]byte{k2}) {
		t.Fatal("verified under the wrong key")
	}
	if VerifyAck(Ack{EventID: "evt-2", Auth: a.Auth}, [][]byte{k1}) {
		t.Fatal("an auth verified for another event ID")
	}
	if VerifyAck(Ack{EventID: "evt-1", Auth: strings.ToUpper(a.Auth)}, [][]byte{k1}) {
		t.Fatal("uppercase hex verified; the format is lowercase")
	}
	plain, _ := EncodeAck("evt-1")
	if string(plain) != `{"event_id":"evt-1","version":1}` {
		t.Fatalf("plain ACK changed: %s", plain)
	}
	if a, err := DecodeAuthAck(plain); err != nil || a.Auth != "" || VerifyAck(a, [][]byte{k1}) {
		t.Fatalf("plain ACK: %+v %v; want no auth, not verified", a, err)
	}
	if _, err := DecodeAuthAck([]byte(`{"auth":1,"event_id":"evt-1","version":1}`)); err == nil {
		t.Fatal("a non-string auth decoded")
	}
}
