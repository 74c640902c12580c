package envelope

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

const (
	testParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	// A tracestate with the two characters JSON escapes (printable ASCII
	// includes them), so the canonical form is exercised.
	testState = `vendor=a"b\c,other=1`
)

// Without a trace context the envelopes are reliomq v1's bytes exactly:
// AddTraceContext of a zero context returns them untouched, and the traced
// decoder reads them like the strict one.
func TestWithoutATraceContextTheV1BytesAreUnchanged(t *testing.T) {
	ing, err := EncodeIngress("e1", "factory/1", []byte(`{"b": 2, "a": [1.50]}`))
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"event_id":"e1","payload":{"a":[1.5],"b":2},"topic":"factory/1","version":1}`
	if string(ing) != want {
		t.Fatalf("ingress %s, want %s", ing, want)
	}
	same, err := AddTraceContext(ing, TraceContext{})
	if err != nil || !bytes.Equal(same, ing) {
		t.Fatalf("AddTraceContext(zero) = %s, %v; want the v1 bytes", same, err)
	}
	m, err := DecodeTracedIngress(ing)
	if err != nil || m.Trace != (TraceContext{}) || m.EventID != "e1" || m.Topic != "factory/1" {
		t.Fatalf("DecodeTracedIngress(v1) = %+v, %v", m, err)
	}
	again, _ := EncodeIngress(m.EventID, m.Topic, m.Payload)
	if !bytes.Equal(again, ing) {
		t.Errorf("re-encoded %s, want %s", again, ing)
	}
	del, _ := EncodeDelivery("e1", []byte(`true`))
	if d, err := DecodeTracedDelivery(del); err != nil || d.Trace != (TraceContext{}) || string(d.Payload) != "true" {
		t.Errorf("DecodeTracedDelivery(v1) = %+v, %v", d, err)
	}
	if got := WithoutTraceContext(ing); !bytes.Equal(got, ing) {
		t.Errorf("WithoutTraceContext(v1) = %s", got)
	}
}

// With a trace context the keys sit in canonical position, the result is
// canonical (Canonical matches Python's json.dumps, TestCanonicalAgreesWithPython),
// and the traced decoders give back exactly what was added.
func TestATraceContextRoundTripsInCanonicalForm(t *testing.T) {
	ing, _ := EncodeIngress("e1", "factory/1", []byte(`{"traceparent":"inner stays"}`))
	del, _ := EncodeDelivery("e1", []byte(`[1]`))
	for _, c := range []struct {
		name string
		env  []byte
		tc   TraceContext
		want string
	}{
		{"ingress", ing, TraceContext{Traceparent: testParent},
			`{"event_id":"e1","payload":{"traceparent":"inner stays"},"topic":"factory/1","traceparent":"` + testParent + `","version":1}`},
		{"ingress with tracestate", ing, TraceContext{Traceparent: testParent, Tracestate: testState},
			`{"event_id":"e1","payload":{"traceparent":"inner stays"},"topic":"factory/1","traceparent":"` + testParent + `","tracestate":"vendor=a\"b\\c,other=1","version":1}`},
		{"delivery with tracestate", del, TraceContext{Traceparent: testParent, Tracestate: testState},
			`{"event_id":"e1","payload":[1],"traceparent":"` + testParent + `","tracestate":"vendor=a\"b\\c,other=1","version":1}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := AddTraceContext(c.env, c.tc)
			if err != nil || string(got) != c.want {
				t.Fatalf("AddTraceContext = %s, %v\nwant %s", got, err, c.want)
			}
			if canon, err := Canonical(got); err != nil || !bytes.Equal(canon, got) {
				t.Errorf("not canonical: Canonical gives %s, %v", canon, err)
			}
			var back TraceContext
			if bytes.Equal(c.env, ing) {
				m, err := DecodeTracedIngress(got)
				if err != nil || m.EventID != "e1" || m.Topic != "factory/1" || string(m.Payload) != `{"traceparent":"inner stays"}` {
					t.Fatalf("DecodeTracedIngress = %+v, %v", m, err)
				}
				back = m.Trace
			} else {
				d, err := DecodeTracedDelivery(got)
				if err != nil || string(d.Payload) != "[1]" {
					t.Fatalf("DecodeTracedDelivery = %+v, %v", d, err)
				}
				back = d.Trace
			}
			if back != c.tc {
				t.Errorf("decoded trace context %+v, want %+v", back, c.tc)
			}
			if stripped := WithoutTraceContext(got); !bytes.Equal(stripped, c.env) {
				t.Errorf("WithoutTraceContext = %s, want %s", stripped, c.env)
			}
			if _, err := AddTraceContext(got, c.tc); err == nil {
				t.Error("a second trace context was added to an envelope that has one")
			}
		})
	}
}

// A decoder without the opt-in refuses the trace keys as reliomq v1 does,
// and says that they are a trace context (ErrTraceContext), so the error a
// user sees can name the setting; any other unknown key is not one.
func TestAStrictDecoderRefusesATraceContextAndSaysSo(t *testing.T) {
	ing, _ := EncodeIngress("e1", "t", []byte(`1`))
	traced, _ := AddTraceContext(ing, TraceContext{Traceparent: testParent})
	_, err := DecodeIngress(traced)
	if !errors.Is(err, ErrMalformed) || !errors.Is(err, ErrTraceContext) || !strings.Contains(err.Error(), `unknown key(s) "traceparent"`) {
		t.Errorf("DecodeIngress(traced) = %v; want malformed, a trace context, naming the key", err)
	}
	del, _ := EncodeDelivery("e1", []byte(`1`))
	stateOnly := strings.Replace(string(del), `,"version"`, `,"tracestate":"a=b","version"`, 1)
	if _, err := DecodeDelivery([]byte(stateOnly)); !errors.Is(err, ErrTraceContext) {
		t.Errorf("DecodeDelivery(tracestate) = %v; want ErrTraceContext", err)
	}
	other := strings.Replace(string(del), `,"version"`, `,"trace":"x","version"`, 1)
	if _, err := DecodeDelivery([]byte(other)); !errors.Is(err, ErrMalformed) || errors.Is(err, ErrTraceContext) {
		t.Errorf("DecodeDelivery(unknown key trace) = %v; want malformed, not a trace context", err)
	}
}

// The traced decoders accept only the two keys, and only a well-formed
// W3C version 00 traceparent; AddTraceContext refuses the same.
func TestAMalformedTraceContextIsRefused(t *testing.T) {
	const (
		id32 = "4bf92f3577b34da6a3ce929d0e0e4736"
		id16 = "00f067aa0ba902b7"
	)
	del := `{"event_id":"e1","payload":1,`
	for _, c := range []struct{ name, keys, want string }{
		{"version 01", `"traceparent":"01-` + id32 + `-` + id16 + `-01",`, "not a W3C version 00 traceparent"},
		{"uppercase hex", `"traceparent":"00-` + strings.ToUpper(id32) + `-` + id16 + `-01",`, "not a W3C version 00 traceparent"},
		{"zero trace ID", `"traceparent":"00-` + strings.Repeat("0", 32) + `-` + id16 + `-01",`, "not a W3C version 00 traceparent"},
		{"zero parent ID", `"traceparent":"00-` + id32 + `-` + strings.Repeat("0", 16) + `-01",`, "not a W3C version 00 traceparent"},
		{"trailing field", `"traceparent":"00-` + id32 + `-` + id16 + `-01-ff",`, "not a W3C version 00 traceparent"},
		{"short", `"traceparent":"00-abc",`, "not a W3C version 00 traceparent"},
		{"empty", `"traceparent":"",`, "traceparent is empty"},
		{"not a string", `"traceparent":1,`, "traceparent must be a JSON string"},
		{"tracestate alone", `"tracestate":"a=b",`, "tracestate without traceparent"},
		{"tracestate empty", `"traceparent":"00-` + id32 + `-` + id16 + `-01","tracestate":"",`, "tracestate is empty"},
		{"tracestate not ASCII", `"traceparent":"00-` + id32 + `-` + id16 + `-01","tracestate":"a=é",`, "outside printable ASCII"},
		{"tracestate control", `"traceparent":"00-` + id32 + `-` + id16 + `-01","tracestate":"a=\u0001",`, "outside printable ASCII"},
		{"another key", `"baggage":"a=b","traceparent":"00-` + id32 + `-` + id16 + `-01",`, `unknown key(s) "baggage"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeTracedDelivery([]byte(del + c.keys + `"version":1}`))
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("DecodeTracedDelivery = %v; want an error containing %q", err, c.want)
			}
		})
	}
	env, _ := EncodeDelivery("e1", []byte(`1`))
	if _, err := AddTraceContext(env, TraceContext{Traceparent: "00-abc"}); !errors.Is(err, ErrMalformed) {
		t.Errorf("AddTraceContext(bad traceparent) = %v", err)
	}
	if _, err := AddTraceContext(env, TraceContext{Tracestate: "a=b"}); !errors.Is(err, ErrMalformed) {
		t.Errorf("AddTraceContext(tracestate alone) = %v", err)
	}
	if _, err := AddTraceContext([]byte(`{"a":1}`), TraceContext{Traceparent: testParent}); !errors.Is(err, ErrMalformed) {
		t.Errorf("AddTraceContext(not an envelope) = %v", err)
	}
}

// WithoutTraceContext strips only an envelope's own keys: a JSON object
// that is not an envelope keeps its "traceparent", and so does a payload.
func TestWithoutTraceContextTouchesOnlyEnvelopes(t *testing.T) {
	for _, in := range []string{`{"traceparent":"x","a":1}`, `not json`, `[1]`} {
		if got := WithoutTraceContext([]byte(in)); string(got) != in {
			t.Errorf("WithoutTraceContext(%s) = %s", in, got)
		}
	}
}

// TestTracedEnvelopesArePythonsBytes: what Python's json.dumps (reliomq's
// encoder: sort_keys, no whitespace, ensure_ascii=False) prints for the
// traced envelope's object is the envelope itself. Skipped without python3.
func TestTracedEnvelopesArePythonsBytes(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed; TestATraceContextRoundTripsInCanonicalForm checks the form with Canonical")
	}
	ing, _ := EncodeIngress("e1", "fábrica/1", []byte(`{"z":"ü\n","a":[-0,2.50]}`))
	got, err := AddTraceContext(ing, TraceContext{Traceparent: testParent, Tracestate: testState})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", `import json,sys
o = json.loads(sys.stdin.buffer.read().decode("utf-8"))
sys.stdout.buffer.write(json.dumps(o, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8"))`)
	cmd.Stdin = bytes.NewReader(got)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	if !bytes.Equal(out, got) {
		t.Errorf("Python prints\n%s\nwe send\n%s", out, got)
	}
}

// FuzzDecodeTracedIngress checks that the traced decoder never panics,
// that every error wraps ErrMalformed, that it accepts everything the
// strict decoder accepts, and that whatever it accepts re-encodes
// (EncodeIngress, AddTraceContext) to the canonical form of the input,
// which decodes to the same message and trace context.
func FuzzDecodeTracedIngress(f *testing.F) {
	ing, _ := EncodeIngress("e1", "t", []byte(`{"a":[1,2]}`))
	traced, _ := AddTraceContext(ing, TraceContext{Traceparent: testParent, Tracestate: testState})
	for _, s := range []string{
		string(ing), string(traced),
		`{"event_id":"e","payload":1,"topic":"t","traceparent":"` + testParent + `","version":1}`,
		`{ "version":1, "traceparent":"` + testParent + `", "topic":"t", "payload":1, "event_id":"e" }`,
		`{"event_id":"e","payload":1,"topic":"t","tracestate":"a=b","version":1}`,
		`{"event_id":"e","payload":1,"topic":"t","traceparent":"00-x","version":1}`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeTracedIngress(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			if _, strictErr := DecodeIngress(b); strictErr == nil {
				t.Fatalf("the strict decoder accepts %q, the traced one refuses it: %v", b, err)
			}
			return
		}
		wire, err := EncodeIngress(m.EventID, m.Topic, m.Payload)
		if err == nil {
			wire, err = AddTraceContext(wire, m.Trace)
		}
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", m, err)
		}
		if canon, err := Canonical(b); err != nil || !bytes.Equal(canon, wire) {
			t.Fatalf("re-encoded %q, but the input's canonical form is %q (%v)", wire, canon, err)
		}
		again, err := DecodeTracedIngress(wire)
		if err != nil || again.EventID != m.EventID || again.Topic != m.Topic || !bytes.Equal(again.Payload, m.Payload) || again.Trace != m.Trace {
			t.Fatalf("round trip changed the message: %+v -> %+v, %v", m, again, err)
		}
	})
}
