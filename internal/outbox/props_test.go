package outbox

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// traceProps is what a record may carry: W3C trace context as user
// properties among others, a key that repeats, bytes that are not UTF-8.
func traceProps() *mqttmsg.Properties {
	return &mqttmsg.Properties{
		User: []mqttmsg.UserProperty{
			{Key: "traceparent", Value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			{Key: "z", Value: "first"},
			{Key: "a", Value: "\xff\x00\xfe binary"},
			{Key: "z", Value: "second"},
			{Key: "tracestate", Value: ""},
		},
		ContentType:     "application/octet-stream",
		ResponseTopic:   "replies/1",
		CorrelationData: []byte{0, 1, 0xfe, 0xff},
		MessageExpiry:   90*time.Second + 5*time.Millisecond,
	}
}

func TestPropertiesRoundTripExactlyAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	cases := []*mqttmsg.Properties{
		traceProps(),
		{},                            // present but empty
		{CorrelationData: []byte{}},   // empty correlation data is not none
		{User: traceProps().User[:1]}, // a trace context alone
		nil,                           // a record without properties
	}
	o := openT(t, path, Options{})
	for i, p := range cases {
		if _, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: string(rune('a' + i)), Topic: "t", Props: p, Payload: []byte{byte(i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o = openT(t, path, Options{})
	got := readAll(t, o)
	if len(got) != len(cases) {
		t.Fatalf("read %d records, want %d", len(got), len(cases))
	}
	for i, r := range got {
		if !reflect.DeepEqual(r.Props, cases[i]) {
			t.Errorf("record %d: properties\n got %#v\nwant %#v", i, r.Props, cases[i])
		}
	}
	// The same event with the same properties is the pending record; with
	// other properties it is a conflict.
	if r, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "a", Topic: "t", Props: traceProps(), Payload: []byte{0}}}); err != nil || r.Seq != got[0].Seq {
		t.Fatalf("retried append: seq %d, %v; want seq %d", r.Seq, err, got[0].Seq)
	}
	other := traceProps()
	other.User[1], other.User[3] = other.User[3], other.User[1]
	if _, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "a", Topic: "t", Props: other, Payload: []byte{0}}}); !errors.Is(err, ErrEventIDConflict) {
		t.Fatalf("append with user properties in another order: %v, want ErrEventIDConflict", err)
	}
	// Removing every record brings the byte count back to zero: what a
	// record counts at append is what its removal takes off.
	if err := o.Remove(seqsOf(got)...); err != nil {
		t.Fatal(err)
	}
	if st := o.Stats(); st.Pending != 0 || st.PendingBytes != 0 {
		t.Fatalf("after removing everything: %+v", st)
	}
}

// TestRecordWithoutPropertiesIsStoredAsBefore: a record without properties
// is the version-2 value, byte for byte, that the code before version 3
// wrote, so an older binary still reads the file.
func TestRecordWithoutPropertiesIsStoredAsBefore(t *testing.T) {
	r := Record{Event: mqttmsg.Event{EventID: "ev", Topic: "a/b", Payload: []byte("payload")}, Seq: 7, Enqueued: time.Unix(0, 1234567890)}
	want := []byte{2}
	want = binary.BigEndian.AppendUint64(want, 1234567890)
	want = append(want, 2, 'e', 'v', 3, 'a', '/', 'b')
	want = append(want, "payload"...)
	key := seqKey(7)
	sum := crc32.Update(crc32.Checksum(key, crc32.MakeTable(crc32.Castagnoli)), crc32.MakeTable(crc32.Castagnoli), want)
	want = binary.BigEndian.AppendUint32(want, sum)
	if got := encodeRecord(&r); !bytes.Equal(got, want) {
		t.Fatalf("encoded\n%x\nwant\n%x", got, want)
	}
	if got := encodeRecord(&Record{Event: mqttmsg.Event{Topic: "t", Props: &mqttmsg.Properties{}}, Seq: 7}); got[0] != recordVersion {
		t.Fatalf("a record with properties has version %d, want %d", got[0], recordVersion)
	}
}

// legacyTopic is the topic field a version-2 record with properties has:
// what the code before version 3 wrote (properties.StoreTopic), verbatim.
const legacyTopic = "a/b\x00" + `{"user":[["event_id","ev-1"],["k","v\"q"],["k","again"]],"content_type":"text/plain","response_topic":"r","correlation_data":"AAH+","message_expiry":3600}`

func legacyWant() *mqttmsg.Properties {
	return &mqttmsg.Properties{
		User:            []mqttmsg.UserProperty{{Key: "event_id", Value: "ev-1"}, {Key: "k", Value: "v\"q"}, {Key: "k", Value: "again"}},
		ContentType:     "text/plain",
		ResponseTopic:   "r",
		CorrelationData: []byte{0, 1, 0xfe},
		MessageExpiry:   time.Hour,
	}
}

func TestRecordWithPropertiesInItsTopicIsReadAsBefore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	o := openT(t, path, Options{})
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	// Write the record as the code before version 3 did: version 2, the
	// properties after a NUL in the topic, counted in pending_bytes.
	f, err := boltfile.AcquireWith(path, boltfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	old := Record{Event: mqttmsg.Event{EventID: "ev-1", Topic: legacyTopic, Payload: []byte("p")}, Seq: 1, Enqueued: time.Unix(0, 42)}
	err = f.Update(func(tx *bolt.Tx) error {
		records, meta := tx.Bucket(bucketRecords), tx.Bucket(bucketMeta)
		seq, _ := records.NextSequence()
		if err := records.Put(seqKey(seq), encodeRecord(&old)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketIDs).Put([]byte(old.EventID), seqKey(seq)); err != nil {
			return err
		}
		return addPending(meta, 1, int64(len(old.EventID)+len(old.Topic)+len(old.Payload)))
	})
	_ = f.Release()
	if err != nil {
		t.Fatal(err)
	}

	o = openT(t, path, Options{})
	got := readAll(t, o)
	if len(got) != 1 || got[0].Topic != "a/b" || got[0].EventID != "ev-1" || string(got[0].Payload) != "p" || !reflect.DeepEqual(got[0].Props, legacyWant()) {
		t.Fatalf("read %+v, want topic a/b with properties %+v", got, legacyWant())
	}
	// The retry of that event today is the same record.
	if r, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "ev-1", Topic: "a/b", Props: legacyWant(), Payload: []byte("p")}}); err != nil || r.Seq != got[0].Seq {
		t.Fatalf("retried append: seq %d, %v; want the pending record", r.Seq, err)
	}
	if err := o.Remove(got[0].Seq); err != nil {
		t.Fatal(err)
	}
	if st := o.Stats(); st.Pending != 0 || st.PendingBytes != 0 {
		t.Fatalf("after removing the old record: %+v", st)
	}
}

func TestUnreadablePropertiesAreDamage(t *testing.T) {
	for _, raw := range [][]byte{{9}, {propsForm, 5}, encodeProps(traceProps())[:20], append(encodeProps(traceProps()), 0)} {
		if _, err := decodeProps(raw); err == nil {
			t.Errorf("decodeProps(%x) accepted", raw)
		}
	}
	if _, _, err := splitLegacyTopic([]byte("a/b\x00{not json")); err == nil {
		t.Error("a version-2 topic with unreadable properties was accepted")
	}
}

// TestSamePropsDecidesWhetherARewriteIsThePendingRecord: with
// Options.SameProps a write of a pending event ID is the pending record
// when SameProps says so (a tracer's traceparent differs on every write),
// and a conflict when it does not.
func TestSamePropsDecidesWhetherARewriteIsThePendingRecord(t *testing.T) {
	ignoreTrace := func(a, b *mqttmsg.Properties) bool {
		get := func(p *mqttmsg.Properties) string { v, _ := p.Get("site"); return v }
		return get(a) == get(b)
	}
	o := openT(t, filepath.Join(t.TempDir(), "outbox.db"), Options{SameProps: ignoreTrace})
	props := func(site, parent string) *mqttmsg.Properties {
		return &mqttmsg.Properties{User: []mqttmsg.UserProperty{{Key: "site", Value: site}, {Key: "traceparent", Value: parent}}}
	}
	first, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "a", Topic: "t", Props: props("x", "00-1"), Payload: []byte{1}}})
	if err != nil {
		t.Fatal(err)
	}
	again, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "a", Topic: "t", Props: props("x", "00-2"), Payload: []byte{1}}})
	if err != nil || again.Seq != first.Seq {
		t.Fatalf("rewrite with another traceparent: seq %d, %v; want the pending seq %d", again.Seq, err, first.Seq)
	}
	if _, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: "a", Topic: "t", Props: props("y", "00-1"), Payload: []byte{1}}}); !errors.Is(err, ErrEventIDConflict) {
		t.Fatalf("rewrite with another site: %v, want ErrEventIDConflict", err)
	}
}
