package mqttin

import (
	"context"
	"errors"
	"sync"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/frame"
	"github.com/reliable-mqtt/reliable-mqtt/internal/inbox"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/properties"
	"github.com/reliable-mqtt/reliable-mqtt/internal/tracing"
)

// frameAttempt builds one delivery attempt of a frame: one batch with a
// message per event, each carrying what that event would carry alone (its
// event_id, destination_topic, user properties, its own hook list and its
// own trace span) plus frame_id, and one AckFunc for the batch that hands
// every event's result to the inbox (inbox.SettleFrame: the frame is
// acknowledged only when every event succeeded).
func (i *input) frameAttempt(d *inbox.Delivery) (service.MessageBatch, service.AckFunc) {
	dec := d.Decoded
	batch := make(service.MessageBatch, len(dec.Events))
	hooks := make([]inbox.Hooks, len(dec.Events))
	for k, e := range dec.Events {
		props := eventProperties(e)
		msg := service.NewMessage(append([]byte(nil), e.Payload...))
		setSource(msg, d)
		properties.Metadata(props, msg.MetaSetMut)
		msg.MetaSetMut(metaEventID, e.ID)
		if e.Topic != "" {
			msg.MetaSetMut(metaDestTopic, e.Topic)
		}
		msg.MetaSetMut(metaFrameID, dec.EventID)
		ctx, h := commit.WithHooks(context.Background())
		ctx = i.spans.Start(ctx, eventTrace(e, props), e.ID, d.Msg.Topic())
		batch[k], hooks[k] = msg.WithContext(ctx), h
	}
	index := batch.Index()

	var once sync.Once
	ack := func(ctx context.Context, result error) error {
		once.Do(func() {
			if i.beginAck() {
				defer i.acking.Done()
			}
			results := eventResults(index, len(batch), result)
			err := i.in.SettleFrame(ctx, d, hooks, results)
			for k, msg := range batch {
				if results[k] != nil {
					i.spans.End(msg.Context(), results[k]) // its own failure
				} else {
					i.spans.End(msg.Context(), err) // the frame's fate
				}
			}
		})
		return nil
	}
	return batch, ack
}

// eventResults splits the pipeline's result for a frame's batch into one
// per event. A *service.BatchError names the events that failed (by their
// place in the batch as read, through index): those failed, the others
// succeeded. Any other error, or a BatchError that names none, fails every
// event.
func eventResults(index *service.Indexer, n int, result error) []error {
	results := make([]error, n)
	if result == nil {
		return results
	}
	var bErr *service.BatchError
	named := false
	if errors.As(result, &bErr) && bErr.IndexedErrors() > 0 {
		bErr.WalkMessagesIndexedBy(index, func(k int, _ *service.Message, err error) bool {
			if err != nil && k >= 0 && k < n {
				results[k], named = err, true
			}
			return true
		})
	}
	if !named {
		for k := range results {
			results[k] = result
		}
	}
	return results
}

// eventProperties are an event's user properties as a received PUBLISH
// would carry them (nil when it has none).
func eventProperties(e frame.Event) *mqttmsg.Properties {
	if len(e.Properties) == 0 {
		return nil
	}
	p := &mqttmsg.Properties{User: make([]mqttmsg.UserProperty, len(e.Properties))}
	for k, u := range e.Properties {
		p.User[k] = mqttmsg.UserProperty{Key: u.Key, Value: u.Value}
	}
	return p
}

// eventTrace is the trace context an event's span continues: the frame's
// own for the event, else the one in its user properties.
func eventTrace(e frame.Event, props *mqttmsg.Properties) envelope.TraceContext {
	if tp := e.Trace[frame.KeyTraceparent]; tp != "" {
		return envelope.TraceContext{Traceparent: tp, Tracestate: e.Trace[frame.KeyTracestate]}
	}
	return tracing.FromProperties(props)
}
