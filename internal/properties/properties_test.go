package properties

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

func up(kv ...string) []mqttmsg.UserProperty {
	var out []mqttmsg.UserProperty
	for i := 0; i < len(kv); i += 2 {
		out = append(out, mqttmsg.UserProperty{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func TestStampPutsEventIDAndDestinationFirstAndKeepsExtra(t *testing.T) {
	extra := &mqttmsg.Properties{User: up("site", "a"), ContentType: "application/octet-stream", MessageExpiry: time.Minute}
	p := Stamp(extra, "ev-1", "plant/line1")
	if want := up("event_id", "ev-1", "destination_topic", "plant/line1", "site", "a"); !reflect.DeepEqual(p.User, want) {
		t.Fatalf("user properties %v, want %v", p.User, want)
	}
	if p.ContentType != "application/octet-stream" || p.MessageExpiry != time.Minute {
		t.Fatalf("other properties lost: %+v", p)
	}
	if len(extra.User) != 1 {
		t.Fatalf("Stamp modified its argument: %v", extra.User)
	}
	if p := Stamp(nil, "ev-2", ""); !reflect.DeepEqual(p.User, up("event_id", "ev-2")) {
		t.Fatalf("delivery hop: user properties %v, want only event_id", p.User)
	}
}

func TestReadRoundTripsStamp(t *testing.T) {
	e, err := Read(Stamp(nil, "ev-1", "plant/line1"))
	if err != nil || e != (Envelope{EventID: "ev-1", DestTopic: "plant/line1"}) {
		t.Fatalf("Read = %+v, %v", e, err)
	}
	e, err = Read(Stamp(nil, "ev-2", ""))
	if err != nil || e != (Envelope{EventID: "ev-2"}) {
		t.Fatalf("Read = %+v, %v", e, err)
	}
}

func TestReadRefusesWhatIsNotAnEnvelope(t *testing.T) {
	cases := map[string]*mqttmsg.Properties{
		"no properties":       nil,
		"no event_id":         {User: up("destination_topic", "a/b")},
		"empty event_id":      {User: up("event_id", "")},
		"invalid event_id":    {User: up("event_id", "has space")},
		"two event_ids":       {User: up("event_id", "a", "event_id", "b")},
		"two destinations":    {User: up("event_id", "a", "destination_topic", "x", "destination_topic", "y")},
		"wildcard topic":      {User: up("event_id", "a", "destination_topic", "x/#")},
		"empty destination":   {User: up("event_id", "a", "destination_topic", "")},
		"content type only":   {ContentType: "text/plain"},
		"differently cased":   {User: up("Event_ID", "a")},
		"event_id with a NUL": {User: up("event_id", "a\x00")},
	}
	for name, p := range cases {
		if e, err := Read(p); err == nil {
			t.Errorf("%s: Read = %+v, want an error", name, e)
		} else if !errors.Is(err, envelope.ErrMalformed) {
			t.Errorf("%s: error %v does not wrap envelope.ErrMalformed", name, err)
		}
	}
}

func TestMetadataNamesEveryPropertyAndListsRepeatedNames(t *testing.T) {
	p := &mqttmsg.Properties{
		User:            up("site", "a", "tag", "x", "tag", "y", "event_id", "ev-1"),
		ContentType:     "application/json",
		ResponseTopic:   "replies/1",
		CorrelationData: []byte{0xff, 0x00, 'c'},
		MessageExpiry:   90 * time.Second,
	}
	type kv struct {
		k string
		v any
	}
	var got []kv
	Metadata(p, func(k string, v any) { got = append(got, kv{k, v}) })
	want := []kv{
		{"mqtt_user_property_site", "a"},
		{"mqtt_user_property_tag", []any{"x", "y"}},
		{"mqtt_user_property_event_id", "ev-1"},
		{"mqtt_content_type", "application/json"},
		{"mqtt_response_topic", "replies/1"},
		{"mqtt_correlation_data", "\xff\x00c"},
		{"mqtt_message_expiry", "90s"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("metadata\n got %v\nwant %v", got, want)
	}
	got = nil
	Metadata(nil, func(k string, v any) { got = append(got, kv{k, v}) })
	Metadata(&mqttmsg.Properties{}, func(k string, v any) { got = append(got, kv{k, v}) })
	if len(got) != 0 {
		t.Fatalf("no properties gave metadata %v", got)
	}
}

func TestOutgoingIsDeterministicAndChecked(t *testing.T) {
	o := Outgoing{User: map[string]string{"z": "1", "a": "2", "m": "3"}, ContentType: "text/plain", MessageExpiry: "90"}
	for range 5 {
		p, err := o.Properties()
		if err != nil {
			t.Fatal(err)
		}
		want := &mqttmsg.Properties{User: up("a", "2", "m", "3", "z", "1"), ContentType: "text/plain", MessageExpiry: 90 * time.Second}
		if !reflect.DeepEqual(p, want) {
			t.Fatalf("Properties() = %+v, want %+v", p, want)
		}
	}
	for _, bad := range []Outgoing{
		{User: map[string]string{"k": "a\x00b"}},
		{ContentType: "\xff"},
		{MessageExpiry: "soon"},
	} {
		if p, err := bad.Properties(); err == nil {
			t.Errorf("%+v gave %+v, want an error", bad, p)
		}
	}
}

func TestParseExpiry(t *testing.T) {
	for in, want := range map[string]time.Duration{"": 0, "90": 90 * time.Second, "90s": 90 * time.Second, "1h": time.Hour} {
		if got, err := ParseExpiry(in); err != nil || got != want {
			t.Errorf("ParseExpiry(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"1.5s", "500ms", "0", "-5", "soon", "5000000000"} {
		if got, err := ParseExpiry(in); err == nil {
			t.Errorf("ParseExpiry(%q) = %s, want an error", in, got)
		}
	}
}

func TestCheckString(t *testing.T) {
	if err := CheckString("value", "ok ü"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"\xff", "a\x00b", strings.Repeat("x", 65536)} {
		if CheckString("value", bad) == nil {
			t.Errorf("CheckString accepted %.20q", bad)
		}
	}
}
