package mqttout

import (
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
)

// logResume says at start what an outbox still holds, so that an operator
// sees after a crash or a restart that the backlog is picked up again.
func logResume(log *service.Logger, ob *outbox.Outbox) {
	st := ob.Stats()
	if st.Pending == 0 {
		log.Infof("outbox %s: no pending records", ob.Path())
		return
	}
	log.Infof("outbox %s: resuming %d pending records (%d bytes), oldest from %s",
		ob.Path(), st.Pending, st.PendingBytes, st.Oldest.UTC().Format(time.RFC3339))
}
