package inbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/failpoint"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// EndToEnd is how the input acknowledges a decoded message end to end:
// after the pipeline is done with it, an ACK with its event ID goes to
// Topic (QoS 1) before the source's PUBACK.
type EndToEnd struct {
	Topic   string        // "": no end-to-end ACKs
	AuthKey []byte        // nil: plain reliomq v1 ACKs; else signed with it
	Timeout time.Duration // for the ACK's PUBACK
	// Ready waits, bounded by ctx, for the client's ready connection. A
	// QoS 0 message has no PUBACK for its ACK to precede: its ACK goes on
	// the connection Ready returns.
	Ready func(ctx context.Context) (Conn, error)
}

// Hooks are the delivery hooks of one attempt (commit.Hooks fits): Run
// calls each with the pipeline's result and reports the first error.
type Hooks interface {
	Run(ctx context.Context, result error) error
}

// Settle ends one delivery attempt of d, which the pipeline finished with
// result (nil: success), in this order:
//
//  1. the attempt's hooks run with result; a hook's error on success fails
//     the attempt;
//  2. on success, with end-to-end ACKs and an event ID, the ACK is
//     published and its PUBACK awaited on the connection d came from, so it
//     precedes d's PUBACK on the wire;
//  3. on success, d's PUBACK/PUBREC is sent (in receive order, Complete);
//     on any failure nothing is acknowledged and d is read again after the
//     retry backoff (Retry), or redelivered by the broker.
//
// It is the only way a delivered message is acknowledged. Safe from any
// goroutine; call it once per attempt. It returns the failure that left
// d unacknowledged (nil: acknowledged), for the attempt's trace span.
func (in *Inbox) Settle(ctx context.Context, d *Delivery, hooks Hooks, result error) error {
	if hooks != nil {
		if err := hooks.Run(ctx, result); err != nil && result == nil {
			result = fmt.Errorf("delivery hook failed: %w", err)
		}
	}
	return in.finish(ctx, d, result)
}

// SettleFrame ends one delivery attempt of d, a frame whose events the
// pipeline finished with results (one per event, in order; nil: success),
// each event with its own hooks:
//
//  1. every event's hooks run with that event's result, all at once, with
//     a commit.Group in their context: the dedup ledger defers the keys of
//     the events that succeeded to it, and the Group's flush records them
//     in one transaction; a hook's error on success fails its event
//     (written into results), a failed flush the frame;
//  2. only when every event succeeded, the frame's end-to-end ACK (its
//     event ID is the frame's ID) and then its PUBACK, as in Settle;
//  3. otherwise nothing of the frame is acknowledged and the whole frame
//     is read again: events that succeeded are then copies, which the
//     ledger drops (their keys were committed in step 1 or with the
//     output's record).
//
// It returns the failure that left the frame unacknowledged (nil:
// acknowledged).
func (in *Inbox) SettleFrame(ctx context.Context, d *Delivery, hooks []Hooks, results []error) error {
	gctx, group := commit.WithGroup(ctx)
	var wg sync.WaitGroup
	for i, h := range hooks {
		if h == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.Run(gctx, results[i]); err != nil && results[i] == nil {
				results[i] = fmt.Errorf("delivery hook failed: %w", err)
			}
		}()
	}
	wg.Wait()
	var result error
	for i, err := range results {
		if err != nil {
			result = fmt.Errorf("event %d of %d in frame %s failed: %w", i+1, len(results), d.Decoded.EventID, err)
			break
		}
	}
	// What the hooks deferred (the ledger keys of the events that
	// succeeded) is committed even when another event failed, so that the
	// frame's redelivery skips those events.
	if err := group.Flush(ctx); err != nil && result == nil {
		result = fmt.Errorf("frame %s: %w", d.Decoded.EventID, err)
	}
	return in.finish(ctx, d, result)
}

// finish acknowledges d end to end and to the broker after a successful
// attempt, or schedules it again after a failed one.
func (in *Inbox) finish(ctx context.Context, d *Delivery, result error) error {
	if result == nil && in.s.Ack.Topic != "" && d.Decoded != nil && d.Decoded.EventID != "" {
		result = in.publishAck(ctx, d)
	}
	if result != nil {
		in.m.Rejected.Incr(1)
		in.log.Debugf("Message on topic %q (packet %d) not acknowledged, it will be delivered again: %v", d.Msg.Topic(), d.Msg.MessageID(), result)
		in.Retry(d)
		return result
	}
	failpoint.Hit(failpoint.BeforeSourceAck)
	d.Complete()
	return nil
}

// publishAck publishes the end-to-end ACK of d on the connection d came
// from and waits, bounded by Ack.Timeout, for its PUBACK.
func (in *Inbox) publishAck(ctx context.Context, d *Delivery) error {
	eventID := d.Decoded.EventID
	payload, err := codec.AckPayload(eventID, in.s.Ack.AuthKey)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, in.s.Ack.Timeout)
	defer cancel()
	conn := d.Conn()
	if d.qos() == 0 {
		if conn, err = in.s.Ack.Ready(ctx); err != nil {
			return err
		}
	}
	if err := conn.Publish(ctx, mqttmsg.Publication{Event: mqttmsg.Event{Topic: in.s.Ack.Topic, Payload: payload}, QoS: 1}); err != nil {
		in.m.AckPublishFails.Incr(1)
		return fmt.Errorf("publishing the end-to-end ACK of event %s to %q: %w", eventID, in.s.Ack.Topic, err)
	}
	in.m.AcksPublished.Incr(1)
	return nil
}

// dropMalformed decodes d's envelope at its first Read (counting and
// logging a malformed one once) and, unless FlagMalformed, acknowledges
// and drops a malformed envelope; it reports whether it did.
func (in *Inbox) dropMalformed(d *Delivery) bool {
	if d.Decoded == nil {
		d.Decoded = codec.Decoding{Mode: in.s.Envelope, TraceContext: in.s.TraceContext}.Decode(d.Msg.Topic(), d.Msg.Payload(), d.Msg.Properties())
		if d.Decoded.Err != nil {
			in.m.Malformed.Incr(1)
			what := "dropped and acknowledged (on_malformed: drop)"
			if in.s.FlagMalformed {
				what = "delivered flagged with an error (on_malformed: flag)"
			}
			in.log.Warnf("%v; %s", d.Decoded.Err, what)
		}
	}
	if d.Decoded.Err == nil || in.s.FlagMalformed {
		return false
	}
	d.Complete()
	return true
}
