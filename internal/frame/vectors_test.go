package frame

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/vectors.json's frame bytes from Encode")

// vector is one test vector of testdata/vectors.json: events, the frame
// Encode writes for them (hex) and its ID. Compressed vectors are checked
// by decoding only: zstd's output may change with the library version,
// the format does not.
type vector struct {
	Name        string        `json:"name"`
	Compression string        `json:"compression"`
	Events      []vectorEvent `json:"events"`
	Frame       string        `json:"frame"`
	ID          string        `json:"id"`
}

type vectorEvent struct {
	ID         string            `json:"id"`
	Topic      string            `json:"topic,omitempty"`
	Payload    string            `json:"payload"` // hex
	Properties [][2]string       `json:"properties,omitempty"`
	Trace      map[string]string `json:"trace,omitempty"`
}

func (v vectorEvent) event(t *testing.T) Event {
	p, err := hex.DecodeString(v.Payload)
	if err != nil {
		t.Fatal(err)
	}
	e := Event{ID: v.ID, Topic: v.Topic, Payload: p, Trace: v.Trace}
	for _, kv := range v.Properties {
		e.Properties = append(e.Properties, Property{kv[0], kv[1]})
	}
	return e
}

// malformedVector is one of testdata/malformed.json: bytes Decode refuses.
type malformedVector struct {
	Name  string `json:"name"`
	Frame string `json:"frame"` // hex
}

func TestVectors(t *testing.T) {
	path := filepath.Join("testdata", "vectors.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) < 3 {
		t.Fatalf("%s has %d vectors", path, len(vs))
	}
	for i, v := range vs {
		var events []Event
		for _, ve := range v.Events {
			events = append(events, ve.event(t))
		}
		enc, id, err := Encode(events, Options{Compression: v.Compression})
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if *update {
			vs[i].Frame, vs[i].ID = hex.EncodeToString(enc), id
			continue
		}
		b, err := hex.DecodeString(v.Frame)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if v.Compression == None && !bytes.Equal(enc, b) {
			t.Errorf("%s: Encode writes\n%x\nthe vector says\n%x", v.Name, enc, b)
		}
		gotID, got, err := Decode(b, DefaultLimits)
		if err != nil {
			t.Errorf("%s: %v", v.Name, err)
			continue
		}
		if gotID != v.ID || id != v.ID {
			t.Errorf("%s: ID %q (Encode %q), the vector says %q", v.Name, gotID, id, v.ID)
		}
		if !reflect.DeepEqual(got, normal(events)) {
			t.Errorf("%s: decoded %#v", v.Name, got)
		}
	}
	if *update {
		out, err := json.MarshalIndent(vs, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	raw, err = os.ReadFile(filepath.Join("testdata", "malformed.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ms []malformedVector
	if err := json.Unmarshal(raw, &ms); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		b, err := hex.DecodeString(m.Frame)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		_, _, err = Decode(b, DefaultLimits)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("malformed vector %q: err = %v", m.Name, err)
		}
		t.Logf("%s: %v", m.Name, err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, c := range []string{None, Zstd} {
		b, _, err := Encode(sample(), Options{Compression: c})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(frameOf(uv(1), event("a", "", "p")))
	f.Add(zstdFrame(1000, zstdBomb(4, false)))
	lim := Limits{MaxEvents: 64, MaxDecodedBytes: 1 << 16}
	f.Fuzz(func(t *testing.T, b []byte) {
		id, events, err := Decode(b, lim)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		if len(events) == 0 || len(events) > lim.MaxEvents {
			t.Fatalf("%d events accepted", len(events))
		}
		// What Decode accepts, Encode accepts and writes back the same.
		again, id2, err := Encode(events, Options{})
		if err != nil || id2 != id {
			t.Fatalf("decoded events re-encode with %v, id %q vs %q", err, id2, id)
		}
		if b[len(Magic)+1] == compNone && !bytes.Equal(again, b) {
			t.Fatalf("an uncompressed frame has a second encoding:\n%x\n%x", b, again)
		}
		_, events2, err := Decode(again, lim)
		if err != nil || !reflect.DeepEqual(events2, events) {
			t.Fatalf("re-encoded frame decodes to %v, %v", events2, err)
		}
	})
}
