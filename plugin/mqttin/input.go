// Package mqttin is the reliable_mqtt_in input: an MQTT consumer with a
// persistent session that acknowledges each message to the broker only after
// the pipeline is done with it.
//
// This package is the Benthos glue (spec, constructor, lifecycle, metrics,
// metadata); envelope decoding lives in internal/codec, and the order in
// which an attempt ends (delivery hooks, end-to-end ACK, PUBACK, or a
// retry: inbox.Settle), the ack order, packet-ID tracking, startup-replay
// hold, retry queue and resume log in internal/inbox.
//
// # Delivery hooks (for processor authors)
//
// Every attempt to deliver a message carries, in the message's context, a
// fresh hook list from package internal/commit:
//
//	if hooks := commit.HooksFrom(msg.Context()); hooks != nil {
//		err := hooks.Register(func(ctx context.Context, result error) error {
//			if result != nil {
//				return nil // the pipeline failed: release what you hold
//			}
//			return commitMyEffect(ctx) // an error here means "not done"
//		})
//		...
//	}
//
// When Benthos acknowledges the message, the input runs the hooks in
// registration order with the pipeline's result (nil = success) before
// anything else. If the result is success and a hook returns an error, the
// delivery counts as failed: no PUBACK/PUBREC, no end-to-end ACK, and the
// message is delivered again (a new attempt with a new, empty hook list). A
// hook therefore sees each attempt exactly once, and a successful hook is
// always followed by the broker acknowledgement unless the connection is lost
// first (then the broker redelivers and the hook must treat the redelivery
// as a duplicate — dedup_ledger does). Hooks of an attempt Benthos never
// acknowledges (hard shutdown, crash) never run.
package mqttin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
	"github.com/reliable-mqtt/reliable-mqtt/internal/benthoslog"
	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/inbox"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
	"github.com/reliable-mqtt/reliable-mqtt/internal/tracing"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/conffield"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/mqttconf"
)

const (
	fieldClientID          = "client_id"
	fieldCleanSession      = "clean_session"
	fieldTopics            = "topics"
	fieldQoS               = "qos"
	fieldReceiveBuffer     = "receive_buffer_size"
	fieldReplayTimeout     = "session_replay_timeout"
	fieldReplayBuffer      = "session_replay_buffer_size"
	fieldEnvelope          = "envelope"
	fieldAckTopic          = "ack_topic"
	fieldAckPublishTimeout = "ack_publish_timeout"
	fieldRetry             = "retry_backoff"
	fieldOnMalformed       = "on_malformed"

	envelopeNone       = codec.None
	envelopeIngress    = codec.Ingress
	envelopeDelivery   = codec.Delivery
	envelopeProperties = codec.Properties

	malformedDrop = "drop"
	malformedFlag = "flag"

	// Metadata keys set on every message.
	metaTopic        = "mqtt_topic"
	metaQoS          = "mqtt_qos"
	metaDuplicate    = "mqtt_duplicate"
	metaRetained     = "mqtt_retained"
	metaMessageID    = "mqtt_message_id"
	metaSubscription = "mqtt_subscription"
	metaEventID      = "event_id"
	metaDestTopic    = "destination_topic"
	metaFrameID      = "frame_id"
)

// closeTimeout bounds Close: Benthos hands Close a context without deadline.
const closeTimeout = shutdown.Commit

func inputSpec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Categories("Services").
		Summary("Consumes MQTT with a persistent session and acknowledges each message to the broker only after the pipeline has finished with it.").
		Description(`
The PUBACK (QoS 1) or PUBREC (QoS 2) of a message is sent only after the pipeline acknowledged it: its output succeeded, or it was deliberately filtered. Acknowledgements leave in the order the messages arrived (MQTT 3.1.1 §4.6), so a later message's acknowledgement waits for the earlier ones of the same connection. A message the pipeline rejects is never acknowledged: the input delivers it again after a backoff (`+"`retry_backoff`"+`), and after a crash the broker redelivers it. An acknowledgement that belongs to a connection that has since dropped is not sent on the new one; the broker's redelivery is handled as a new delivery. QoS 2: once a message's PUBREC is sent its packet ID is kept until the PUBREL, across reconnects of the process, and a PUBLISH resent with DUP=1 meanwhile is answered with PUBREC and not delivered again; after a restart it is delivered again. The guarantee is at least once: a message can reach the pipeline more than once, so make its effect idempotent (see `+"`dedup_ledger`"+`). `+"`mqtt_duplicate`"+` is not a reliable duplicate signal (some brokers set it on first deliveries).

Use a stable `+"`client_id`"+` and keep `+"`clean_session: false`"+`: the broker then keeps the subscriptions and queues messages while the pipeline is down. Shutdown disconnects without UNSUBSCRIBE, so the session survives restarts.

### Startup replay

A resumed session may receive messages that match none of `+"`topics`"+` (left over from subscriptions of an earlier configuration). With `+"`clean_session: false`"+` such messages are held, unacknowledged, starting a grace period of `+"`session_replay_timeout`"+` from the first held message (not extended by later ones). At its end they are dropped locally without acknowledgement, with one warning; the broker redelivers them on the next resumed connection. For the rest of that connection, unmatched messages are acknowledged and dropped (ordinary routing). More than `+"`session_replay_buffer_size`"+` held messages close the connection fail-closed with an error naming the limit, acknowledging nothing. Messages that match are delivered in receive order; those beyond `+"`receive_buffer_size`"+` wait unacknowledged until the pipeline makes room, bounded by the broker's in-flight window. QoS 0 messages, which have no in-flight window, are capped at `+"`receive_buffer_size`"+` (the oldest is dropped with a warning), and a disconnect loses the ones not yet read.

### Envelopes and end-to-end ACKs

With `+"`envelope: ingress`"+` or `+"`delivery`"+` the payload is decoded strictly as a reliomq v1 envelope: the message body becomes the inner payload, with metadata `+"`event_id`"+` (and `+"`destination_topic`"+` for ingress). A malformed envelope is acknowledged and dropped with a warning (`+"`on_malformed: drop`"+`, the default), or, with `+"`on_malformed: flag`"+`, reaches the pipeline unchanged and flagged with an error, so a `+"`switch`"+` output on `+"`errored()`"+` can route it to a dead-letter output; it never produces an end-to-end ACK, and once the pipeline acknowledges it the source message is acknowledged to the broker. With `+"`ack_topic`"+` set, after the pipeline acknowledges a decoded message the input publishes `+"`{\"event_id\":\"...\",\"version\":1}`"+` there (QoS 1, on the same connection), waits for its PUBACK, and only then acknowledges the source; if that publish fails the message counts as rejected. A bridge is then plain YAML: `+"`reliable_mqtt_in`"+` with `+"`envelope: ingress`"+` and `+"`ack_topic`"+` → `+"`reliable_mqtt_out`"+` with `+"`topic: ${! meta(\"destination_topic\") }`"+` and the outbox off.

### Frames

With `+"`envelope: ingress`"+`, `+"`delivery`"+` or `+"`properties`"+` a payload that starts with the frame magic is a frame of several events (docs/frames.md), read without any setting; with `+"`envelope: none`"+` it stays one opaque message. A frame becomes ONE batch with a message per event, each carrying what that event would carry alone (`+"`event_id`"+`, `+"`destination_topic`"+`, its MQTT 5 user properties, its own delivery hooks and trace span) plus `+"`frame_id`"+`. The frame's end-to-end ACK (its `+"`event_id`"+` is the frame's ID) and its PUBACK go only after every message of the batch succeeded; when one fails, each message's hooks still see their own result (so `+"`dedup_ledger`"+` records the keys of those that succeeded) and the whole frame comes again. A malformed frame (or one that would expand past 32 MiB or hold more than 10,000 events) is handled as a malformed envelope (`+"`on_malformed`"+`), never expanded; with `+"`envelope: ingress`"+` every event must carry a destination topic.

### Delivery hooks

Each delivery attempt carries a hook list in the message's context (Go package `+"`internal/commit`"+`: `+"`commit.HooksFrom(msg.Context()).Register(hook)`"+`). When the pipeline acknowledges the message the input runs the hooks with the result first; a hook error on success turns the attempt into a failure (no acknowledgement, retried). `+"`dedup_ledger`"+` commits its keys this way.

### Metadata

`+"`mqtt_topic`, `mqtt_qos`, `mqtt_duplicate`, `mqtt_retained`, `mqtt_message_id`, `mqtt_subscription`"+` (the configured filter that matched: an exact filter beats one with `+"`+`"+`, which beats one with `+"`#`"+`, then the order of `+"`topics`"+`; for `+"`$share/group/filter`"+` entries the whole configured string), and `+"`event_id`, `destination_topic`"+` from envelopes (and `+"`frame_id`"+` on a frame's messages). MQTT 5 messages add their properties: each user property as `+"`mqtt_user_property_<name>`"+` (a string; a name that occurs more than once gives the list of its values in arrival order, as structured metadata: `+"`@mqtt_user_property_<name>`"+` is the list), `+"`mqtt_content_type`, `mqtt_response_topic`, `mqtt_correlation_data`"+` (its bytes as they are) and `+"`mqtt_message_expiry`"+` (the remaining interval the broker sent, in whole seconds: `+"`90s`"+`), each only when present.

Use `+"`buffer: none`"+` (the default): a buffer acknowledges the input before the output has the message.

### MQTT 3.1.1 and MQTT 5

Every field and option applies to both protocol versions unless its description starts with "MQTT 5 only"; those stop the process at start on 3.1.1 (the default). With MQTT 5: `+"`envelope: properties`"+` reads the event ID from user properties and leaves the payload bytes alone; received properties become metadata (above); `+"`receive_buffer_size`"+` is sent as Receive Maximum; `+"`session_expiry_interval`"+` bounds how long the broker keeps the session.`).
		Fields(mqttconf.ConnectionFields()...).
		Fields(
			service.NewStringField(fieldClientID).
				Description("MQTT client ID. Required and stable: it names the persistent session that keeps subscriptions and queued messages across restarts. Two processes with one ID take the session from each other.").
				Example("orders-consumer-1"),
			service.NewBoolField(fieldCleanSession).
				Description("Start a new, empty session on every connection. Messages published while the pipeline is down are then lost.").
				Default(false).Advanced(),
			service.NewStringListField(fieldTopics).
				Description("Topic filters to subscribe to. `+` and `#` wildcards and shared subscriptions (`$share/<group>/<filter>`) are allowed.").
				Example([]string{"factory/+/data", "$share/consumers/orders/#"}),
			service.NewIntField(fieldQoS).
				Description("The QoS to subscribe with: 0, 1 or 2. A message arrives at the lower of its publish QoS and this one; only QoS 1 and 2 survive a crash.").
				Default(1),
			service.NewIntField(fieldReceiveBuffer).
				Description("How many received messages may wait for the pipeline to read them. QoS 1/2 messages beyond it wait unacknowledged (the broker's in-flight window bounds them); QoS 0 messages beyond it are dropped, oldest first, with a warning. With MQTT 5 it is also sent as Receive Maximum (capped at 65535): the broker may have that many QoS 1/2 messages unacknowledged at once (on 3.1.1 the broker decides alone, e.g. mosquitto's `max_inflight_messages`, 20 by default).").
				Default(1000).Advanced(),
			service.NewDurationField(fieldReplayTimeout).
				Description("How long, from the first held message, unmatched messages of a resumed session are held before they are dropped locally without acknowledgement.").
				Default("30s").Advanced(),
			service.NewIntField(fieldReplayBuffer).
				Description("At most this many unmatched messages are held per connection during startup replay; one more closes the connection fail-closed, acknowledging nothing. 0 means unbounded.").
				Default(1000).Advanced(),
			service.NewStringAnnotatedEnumField(fieldEnvelope, map[string]string{
				envelopeNone:       "Deliver the payload bytes unchanged.",
				envelopeIngress:    "Decode a reliomq v1 ingress envelope: body = inner payload, metadata `event_id` and `destination_topic`.",
				envelopeDelivery:   "Decode a reliomq v1 delivery envelope: body = inner payload, metadata `event_id`.",
				envelopeProperties: "MQTT 5 only (`protocol_version: \"5\"`): the payload bytes are the body, unchanged; metadata `event_id` from the user property `event_id` (required) and `destination_topic` from the user property `destination_topic` (when present), as `reliable_mqtt_out` with `envelope: properties` sends them. A message without `event_id`, with an invalid one, or with either property twice is malformed.",
			}).Description("How the payload is decoded. What happens to a malformed envelope is set by `on_malformed`. The reliomq v1 envelopes work on both protocol versions.").Default(envelopeNone),
			traceContextField(),
			service.NewStringAnnotatedEnumField(fieldOnMalformed, map[string]string{
				malformedDrop: "Acknowledge the source message and drop it, with a warning naming its topic and the defect, counted in `reliable_mqtt_in_malformed_envelopes`. It never reaches the pipeline, so it cannot be forwarded as if it were valid, and it cannot stall the broker's in-flight window.",
				malformedFlag: "Deliver it unchanged, flagged with an error, without `event_id` or `destination_topic`: route it with a `switch` output on `errored()` (e.g. to a dead-letter topic). `reliable_mqtt_out` refuses a flagged message, and a message the pipeline never acknowledges is delivered again.",
			}).Description("With `envelope: ingress`, `delivery` or `properties`: what to do with a message that is not a valid envelope. It never produces an end-to-end ACK.").Default(malformedDrop),
			service.NewStringField(fieldAckTopic).
				Description("When set (requires `envelope: ingress`, `delivery` or `properties`), publish an end-to-end ACK for each successfully processed message to this topic before acknowledging the source.").
				Default("").Example("reliomq/acks"),
		).
		Fields(mqttconf.AckAuthFields("With `ack_topic`, every ACK carries `\"auth\"`: the lowercase hex HMAC-SHA256 of its event ID under this key (the first of `ack_auth_keys`).")...).
		Fields(
			service.NewDurationField(fieldAckPublishTimeout).
				Description("How long to wait for the broker's PUBACK of an end-to-end ACK before counting the message as rejected.").
				Default("5s").Advanced(),
			conffield.BackoffField(fieldRetry, "Delay before a rejected message is delivered again; it doubles with each rejection of the same message.", "100ms", "5s"),
		).
		LintRule(inputLintRule).
		Example("Persistent consumer", "Consume commands; nothing is acknowledged before the output succeeded.", `
input:
  reliable_mqtt_in:
    urls: [ "tcp://127.0.0.1:1883" ]
    client_id: commands-worker-1
    topics: [ "commands/#" ]
    qos: 1
output:
  stdout: {}
`).
		Example("Bridge", "Receive ingress envelopes, publish their payload to the destination topic, and ACK each event end to end once the destination broker confirmed it.", `
input:
  reliable_mqtt_in:
    urls: [ "tcp://edge:1883" ]
    client_id: bridge-1
    topics: [ "reliomq/messages" ]
    envelope: ingress
    ack_topic: reliomq/acks
output:
  reliable_mqtt_out:
    urls: [ "tcp://cloud:1883" ]
    topic: '${! meta("destination_topic") }'
    event_id: '${! meta("event_id") }'
    envelope: delivery
    outbox:
      enabled: false
`)
}

// inputLintRule finds, at `lint` time, the combinations parseSettings
// refuses at start (Benthos runs it on the YAML as written).
const inputLintRule = `
let v5 = this.protocol_version.or("3.1.1") == "5"
let envelope = this.envelope.or("none")
let v5only = [
  if $envelope == "properties" { "envelope: properties" },
  if this.session_expiry_interval != null { "session_expiry_interval" },
].filter(v -> v != null)
root = [
  if !$v5 && $v5only.length() > 0 { $v5only.join(", ") + ": MQTT 5 only: set protocol_version: \"5\" (the broker must speak it), or remove them" },
  if this.client_id.or("unset") == "" { "client_id must not be empty: it names the persistent session that keeps messages while the pipeline is down" },
  if this.ack_topic.or("") != "" && $envelope == "none" { "ack_topic needs envelope: ingress, delivery or properties, since only a decoded envelope carries the event_id to acknowledge" },
  if this.ack_topic.or("") == "" && (this.ack_auth_key.or("") != "" || !["[]", "null"].contains(this.ack_auth_keys.or([]).string())) { "ack_auth_key needs ack_topic: it signs the end-to-end ACKs sent there" },
  if ![0, 1, 2].contains(this.qos.or(1)) { "qos must be 0, 1 or 2" },
  if this.trace_context.or("properties") == "envelope" && !["ingress", "delivery"].contains($envelope) { "trace_context: envelope needs envelope: ingress or delivery, the reliomq v1 envelopes that carry it" },
].filter(v -> v != null)
`

func init() {
	err := service.RegisterBatchInput("reliable_mqtt_in", inputSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchInput, error) {
			return newInput(conf, mgr)
		})
	if err != nil {
		panic(err)
	}
}

// settings is the parsed, validated configuration.
type settings struct {
	client            mqttclient.Config
	topics            []string
	subs              inbox.Subscriptions
	qos               byte
	receiveBufferSize int
	replayTimeout     time.Duration
	replayBufferSize  int
	envelope          string
	traceEnvelope     bool // trace_context: envelope
	flagMalformed     bool
	ackTopic          string
	ackAuthKey        []byte // nil: plain reliomq v1 ACKs
	ackPublishTimeout time.Duration
	retry             backoff.Backoff
}

func parseSettings(conf *service.ParsedConfig) (s settings, err error) {
	if s.client, err = mqttconf.ParseConfig(conf); err != nil {
		return s, err
	}
	var qos int
	var onMalformed string
	err = conffield.Read(conf,
		conffield.String(&s.client.ClientID, fieldClientID), conffield.Bool(&s.client.CleanSession, fieldCleanSession),
		conffield.StringList(&s.topics, fieldTopics), conffield.Int(&qos, fieldQoS),
		conffield.Int(&s.receiveBufferSize, fieldReceiveBuffer), conffield.PositiveDuration(&s.replayTimeout, fieldReplayTimeout),
		conffield.Int(&s.replayBufferSize, fieldReplayBuffer),
		conffield.Enum(&s.envelope, fieldEnvelope, envelopeNone, envelopeIngress, envelopeDelivery, envelopeProperties),
		conffield.Enum(&onMalformed, fieldOnMalformed, malformedDrop, malformedFlag),
		conffield.String(&s.ackTopic, fieldAckTopic), conffield.PositiveDuration(&s.ackPublishTimeout, fieldAckPublishTimeout))
	if err != nil {
		return s, err
	}
	s.flagMalformed = onMalformed == malformedFlag
	if s.client.ClientID == "" {
		return s, errors.New("client_id must not be empty: it names the persistent session that keeps messages while the pipeline is down")
	}
	if s.subs, err = inbox.ParseSubscriptions(s.topics); err != nil {
		return s, err
	}
	if qos < 0 || qos > 2 {
		return s, fmt.Errorf("qos must be 0, 1 or 2, got %d", qos)
	}
	s.qos = byte(qos)
	if s.receiveBufferSize < 1 {
		return s, fmt.Errorf("receive_buffer_size must be at least 1, got %d", s.receiveBufferSize)
	}
	if s.replayBufferSize < 0 {
		return s, fmt.Errorf("session_replay_buffer_size must be 0 (unbounded) or positive, got %d", s.replayBufferSize)
	}
	if s.envelope == envelopeProperties && s.client.ProtocolVersion != mqttclient.V5 {
		return s, errors.New("envelope: properties needs MQTT 5: set protocol_version: \"5\" (the broker must speak it), or use envelope: ingress or delivery")
	}
	if s.traceEnvelope, err = parseTraceContext(conf, s.envelope); err != nil {
		return s, err
	}
	// Receive Maximum: as many unacknowledged messages as can wait here.
	s.client.ReceiveMaximum = uint16(min(s.receiveBufferSize, 65535))
	if s.ackTopic != "" {
		if s.envelope == envelopeNone {
			return s, errors.New("ack_topic needs envelope: ingress, delivery or properties, since only a decoded envelope carries the event_id to acknowledge")
		}
		if err := envelope.CheckPublishTopic(s.ackTopic); err != nil {
			return s, fmt.Errorf("ack_topic %q: %w", s.ackTopic, err)
		}
	}
	keys, err := mqttconf.ParseAckAuthKeys(conf)
	if err != nil {
		return s, err
	}
	if keys != nil {
		if s.ackTopic == "" {
			return s, errors.New("ack_auth_key needs ack_topic: it signs the end-to-end ACKs sent there")
		}
		s.ackAuthKey = keys[0]
	}
	if s.retry, err = conffield.ParseBackoff(conf, fieldRetry); err != nil {
		return s, err
	}
	return s, nil
}

type input struct {
	s   settings
	log *service.Logger
	m   *metrics
	// spans are the delivery attempts' trace spans; nil with the tracer off.
	spans *tracing.Receives
	in    *inbox.Inbox // routing, replay hold, retries and the broker acks

	resumed *inbox.ResumeLog

	mu     sync.Mutex
	client mqttclient.Transport
	closed bool

	retainedWarn benthoslog.Every // at most one retained-envelope warning per Interval

	acking sync.WaitGroup // AckFuncs begun before Close; Close waits for them (bounded). Add only via beginAck
}

func newInput(conf *service.ParsedConfig, mgr *service.Resources) (*input, error) {
	s, err := parseSettings(conf)
	if err != nil {
		return nil, err
	}
	m := newMetrics(mgr.Metrics())
	cfg := inbox.Config{
		ClientID:          s.client.ClientID,
		CleanSession:      s.client.CleanSession,
		Topics:            s.topics,
		Subs:              s.subs,
		ReceiveBufferSize: s.receiveBufferSize,
		ReplayTimeout:     s.replayTimeout,
		ReplayBufferSize:  s.replayBufferSize,
		Retry:             s.retry,
		Envelope:          s.envelope,
		TraceContext:      s.traceEnvelope,
		FlagMalformed:     s.flagMalformed,
	}
	hop := mgr.Label()
	if hop == "" {
		hop = "reliable_mqtt_in"
	}
	i := &input{s: s, log: mgr.Logger(), m: m, spans: tracing.NewReceives(mgr.OtelTracer(), hop), retainedWarn: benthoslog.Every{Interval: 10 * time.Second}}
	if s.ackTopic != "" {
		cfg.Ack = inbox.EndToEnd{Topic: s.ackTopic, AuthKey: s.ackAuthKey, Timeout: s.ackPublishTimeout, Ready: i.ready}
	}
	i.in = inbox.New(cfg, &m.inbox, mgr.Logger())
	i.resumed = inbox.NewResumeLog(cfg, mgr.Logger())
	return i, nil
}

// ready waits, bounded by ctx, for the client's ready connection.
func (i *input) ready(ctx context.Context) (inbox.Conn, error) {
	i.mu.Lock()
	client := i.client
	i.mu.Unlock()
	if client == nil {
		return nil, mqttclient.ErrNotConnected
	}
	conn, err := client.WaitReady(ctx)
	if err != nil {
		return nil, err
	}
	return conn, nil
}

// Connect starts the client (once) and waits, bounded, for a connection
// with its subscriptions in place. The client keeps reconnecting by itself;
// a failed Connect only reports that no broker has been reached yet.
func (i *input) Connect(ctx context.Context) error {
	i.mu.Lock()
	if i.closed {
		i.mu.Unlock()
		return service.ErrEndOfInput
	}
	if i.client == nil {
		client, err := mqttconf.ClientStarter(i.log, true)(i.s.client, mqttclient.Handlers{
			OnMessage: func(conn mqttclient.Conn, msg mqttmsg.Message) {
				i.resumed.OnMessage(conn.Gen(), msg)
				i.in.OnMessage(conn, msg)
			},
			OnPubrel: func(_ mqttclient.Conn, id uint16) { i.in.OnPubrel(id) },
			OnConnect: func(ctx context.Context, conn mqttclient.Conn) error {
				i.resumed.OnConnect(conn.Gen(), conn.SessionPresent())
				if !conn.SessionPresent() {
					i.in.ResetSession() // no session, no open exchanges
				}
				return conn.Subscribe(ctx, i.s.subs.BrokerFilters(i.s.qos))
			},
			OnLink: i.m.setConnected,
		})
		if err != nil {
			i.mu.Unlock()
			return err
		}
		i.client = client
	}
	client := i.client
	i.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, i.s.client.ConnectTimeout+time.Second)
	defer cancel()
	if _, err := client.WaitReady(ctx); err != nil {
		return fmt.Errorf("no MQTT connection to %v as %q yet (still trying in the background): %w", i.s.client.URLs, i.s.client.ClientID, err)
	}
	return nil
}

// ReadBatch returns the next delivery: a rejected message whose backoff
// has passed, or the oldest received one; one message, or a frame's
// events as one batch (frame.go). Without a live connection it returns
// service.ErrNotConnected, at once or when the connection it waits on is
// lost: Benthos then marks the input not ready (/ready answers 503) and
// calls Connect until the client has reconnected. Deliveries of a lost
// connection are stale anyway (their acknowledgement would go nowhere; the
// broker redelivers them).
func (i *input) ReadBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	i.mu.Lock()
	client := i.client
	i.mu.Unlock()
	if client == nil {
		return nil, nil, service.ErrNotConnected
	}
	conn := client.Current()
	if conn == nil {
		return nil, nil, service.ErrNotConnected
	}
	readCtx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(conn.Context(), cancel)
	d, err := i.in.Read(readCtx)
	stop()
	cancel()
	if errors.Is(err, inbox.ErrClosed) {
		return nil, nil, service.ErrEndOfInput
	}
	if err != nil && ctx.Err() == nil && !conn.Alive() {
		return nil, nil, service.ErrNotConnected
	}
	if err != nil {
		return nil, nil, err
	}
	if d.Decoded.Err == nil && d.Msg.Retained() && i.s.envelope != envelopeNone {
		i.warnRetained(d.Msg.Topic(), d.Decoded.EventID)
	}
	if d.Decoded.Events != nil {
		batch, ack := i.frameAttempt(d)
		return batch, ack, nil
	}
	msg, ack := i.attempt(d)
	return service.MessageBatch{msg}, ack, nil
}

// beginAck counts an acknowledgement in progress, for Close to wait on.
// Once Close has begun it counts nothing and returns false: the ack still
// runs to its end, but nothing waits for it, so no acking.Add races with Close's
// acking.Wait.
func (i *input) beginAck() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return false
	}
	i.acking.Add(1)
	return true
}

// Close stops routing, waits (bounded) for acknowledgements in progress,
// then disconnects without UNSUBSCRIBE so the session and its queued
// messages stay at the broker.
func (i *input) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, closeTimeout)
	defer cancel()
	i.mu.Lock()
	i.closed = true
	client := i.client
	i.client = nil
	i.mu.Unlock()

	i.in.Close()
	select {
	case <-shutdown.Go(i.acking.Wait):
	case <-ctx.Done():
		i.log.Warnf("Closing reliable_mqtt_in: acknowledgements still in progress after %s; the broker redelivers those messages", closeTimeout)
	}
	if client == nil {
		return nil
	}
	return client.Close(ctx)
}
