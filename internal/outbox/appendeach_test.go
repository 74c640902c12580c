package outbox

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// AppendEach skips entries that already failed, appends the others, and
// names the event and the file of one that fails.
func TestAppendEach(t *testing.T) {
	o := openT(t, filepath.Join(t.TempDir(), "ob.db"), Options{})
	appendT(t, o, "e3", "t", "old")
	earlier := errors.New("refused before")
	entries := []Entry{
		{Event: mqttmsg.Event{EventID: "e1", Topic: "t", Payload: []byte("1")}},
		{Event: mqttmsg.Event{EventID: "e2", Topic: "t", Payload: []byte("2")}},
		{Event: mqttmsg.Event{EventID: "e3", Topic: "t", Payload: []byte("other")}}, // conflicts with the pending e3
	}
	errs := []error{nil, earlier, nil}
	o.AppendEach(context.Background(), entries, errs)
	if errs[0] != nil || errs[1] != earlier {
		t.Errorf("errs %v, want e1 stored and e2's own error kept", errs)
	}
	if errs[2] == nil || !strings.Contains(errs[2].Error(), "event e3 not stored in outbox "+o.Path()) {
		t.Errorf("conflicting e3: %v", errs[2])
	}
	if st := o.Stats(); st.Pending != 2 {
		t.Errorf("%d pending, want 2 (e3 and e1)", st.Pending)
	}
}
