package envelope

import (
	"bytes"
	"testing"
)

// splitIngress and splitDelivery read what EncodeIngress, EncodeDelivery
// and AddTraceContext write exactly as the strict decoders do, and refuse
// (ok false) what is not in that form, which ReadOwnIngress then decodes
// strictly.
func TestSplitReadsCanonicalEnvelopesAsTheStrictDecoderDoes(t *testing.T) {
	payloads := []string{`{}`, `[]`, `0`, `-1.5e3`, `true`, `null`, `"s"`, `"a,\"b\"}]"`,
		`{"a":[1,{"b":"},{"}],"c":{"d":null}}`, `{"topic":"x","version":1}`, `"ü 日本"`}
	traces := []TraceContext{{}, {Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "k=v"}}
	for _, p := range payloads {
		for _, tc := range traces {
			in, err := EncodeIngress("ev-1", "plant/a", []byte(p))
			if err != nil {
				t.Fatal(err)
			}
			if in, err = AddTraceContext(in, tc); err != nil {
				t.Fatal(err)
			}
			want, err := DecodeTracedIngress(in)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := splitIngress(in)
			if !ok || got.EventID != want.EventID || got.Topic != want.Topic || !bytes.Equal(got.Payload, want.Payload) || got.Trace != want.Trace {
				t.Fatalf("splitIngress(%s) = %+v, %v; want %+v", in, got, ok, want)
			}
			del, err := EncodeDelivery("ev-2", []byte(p))
			if err != nil {
				t.Fatal(err)
			}
			if del, err = AddTraceContext(del, tc); err != nil {
				t.Fatal(err)
			}
			wantDel, err := DecodeTracedDelivery(del)
			if err != nil {
				t.Fatal(err)
			}
			gotDel, ok := splitDelivery(del)
			if !ok || gotDel.EventID != wantDel.EventID || !bytes.Equal(gotDel.Payload, wantDel.Payload) || gotDel.Trace != wantDel.Trace {
				t.Fatalf("splitDelivery(%s) = %+v, %v; want %+v", del, gotDel, ok, wantDel)
			}
		}
	}
	quoted, err := EncodeIngress("ev-1", `plant/"a"`, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if in, err := ReadOwnIngress(quoted); err != nil || in.Topic != `plant/"a"` {
		t.Fatalf("ReadOwnIngress(%s) = %+v, %v; want the strict decoder's topic", quoted, in, err)
	}
	for _, b := range []string{
		string(quoted), // an escape in the topic: the strict decoder reads it
		`{"payload":{},"event_id":"ev-1","topic":"t","version":1}`,
		`{"event_id":"ev-1","payload":{},"topic":"t","version":1} `,
		`{"event_id":"ev-1","payload":{},"topic":"t","version":2}`,
		`{"event_id":"ev-1","payload":{},"topic":"t/#","version":1}`,
		`{"event_id":"ev 1","payload":{},"topic":"t","version":1}`,
		`{"event_id":"ev-1","payload":,"topic":"t","version":1}`,
		`{"event_id":"ev-1","payload":{"a":"}`,
		`{"event_id":"ev-1","payload":{},"topic":"t","traceparent":"00-bad","version":1}`,
	} {
		if got, ok := splitIngress([]byte(b)); ok {
			t.Errorf("splitIngress(%s) = %+v, want not ok", b, got)
		}
	}
}
