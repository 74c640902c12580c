package mqttin

import (
	"context"
	"strconv"
	"sync"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/inbox"
	"github.com/reliable-mqtt/reliable-mqtt/internal/properties"
)

// setSource sets the metadata of the PUBLISH d came in, which every
// message made of it carries.
func setSource(msg *service.Message, d *inbox.Delivery) {
	msg.MetaSetMut(metaTopic, d.Msg.Topic())
	msg.MetaSetMut(metaQoS, strconv.Itoa(int(d.Msg.Qos())))
	msg.MetaSetMut(metaDuplicate, strconv.FormatBool(d.Msg.Duplicate()))
	msg.MetaSetMut(metaRetained, strconv.FormatBool(d.Msg.Retained()))
	msg.MetaSetMut(metaMessageID, strconv.Itoa(int(d.Msg.MessageID())))
	msg.MetaSetMut(metaSubscription, d.Sub)
}

// attempt builds one delivery attempt: a fresh message with a fresh hook
// list in its context, and the AckFunc that hands its result to the
// inbox (inbox.Settle: hooks, end-to-end ACK, PUBACK, or a retry).
func (i *input) attempt(d *inbox.Delivery) (*service.Message, service.AckFunc) {
	dec := d.Decoded // set by Read
	// A copy per attempt: what one attempt's processors do to the bytes must
	// not leak into the next attempt.
	msg := service.NewMessage(append([]byte(nil), dec.Body...))
	setSource(msg, d)
	properties.Metadata(d.Msg.Properties(), msg.MetaSetMut)
	if dec.EventID != "" {
		msg.MetaSetMut(metaEventID, dec.EventID)
	}
	if dec.DestTopic != "" {
		msg.MetaSetMut(metaDestTopic, dec.DestTopic)
	}
	if dec.Err != nil {
		msg.SetError(dec.Err)
	}
	ctx, hooks := commit.WithHooks(context.Background())
	ctx = i.spans.Start(ctx, traceParent(d), dec.EventID, d.Msg.Topic())
	msg = msg.WithContext(ctx)

	var once sync.Once
	ack := func(ctx context.Context, result error) error {
		once.Do(func() {
			if i.beginAck() {
				defer i.acking.Done()
			}
			i.spans.End(msg.Context(), i.in.Settle(ctx, d, hooks, result))
		})
		return nil
	}
	return msg, ack
}
