// Package mqttout is the reliable_mqtt_out output: a durable bbolt outbox in
// front of a QoS 1 publisher that keeps every message until it is confirmed,
// by the broker's PUBACK or end to end by an application ACK.
//
// This package is the Benthos glue: spec, parsing, interpolation and the
// metrics and span adapters. The write path (client, outbox or direct
// mode, confirmation, encoding, window) has one owner, sender.Output.
package mqttout

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/codec"
	"github.com/reliable-mqtt/reliable-mqtt/internal/envelope"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sender"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/conffield"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/mqttconf"
)

const (
	fieldClientID        = "client_id"
	fieldTopic           = "topic"
	fieldEventID         = "event_id"
	fieldConfirm         = "confirm"
	fieldDataTopic       = "data_topic"
	fieldAckTopic        = "ack_topic"
	fieldEnvelope        = "envelope"
	fieldOutbox          = "outbox"
	fieldOutboxEnabled   = "enabled"
	fieldOutboxPath      = "path"
	fieldOutboxMaxCount  = "max_pending"
	fieldOutboxMaxBytes  = "max_pending_bytes"
	fieldOutboxVerify    = "verify_on_start"
	fieldOutboxDelay     = "commit_delay"
	fieldWindow          = "window"
	fieldAckTimeout      = "ack_timeout"
	fieldPublishTimeout  = "publish_timeout"
	fieldRetry           = "retry_backoff"
	fieldMaxPayloadBytes = "max_payload_bytes"
	fieldStatsInterval   = "stats_interval"
	fieldRetained        = "retained"
	fieldUserProperties  = "user_properties"
	fieldContentType     = "content_type"
	fieldMessageExpiry   = "message_expiry"
	fieldRequireSubs     = "require_subscribers"
	fieldBatching        = "batching"
	fieldPack            = "pack"
	fieldPackMaxEvents   = "max_events"
	fieldPackMaxBytes    = "max_bytes"
	fieldPackCompression = "compression"

	confirmBroker      = "broker"
	confirmEndToEnd    = "end_to_end"
	envelopeNone       = codec.None
	envelopeDelivery   = codec.Delivery
	envelopeProperties = codec.Properties
)

func outputSpec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Categories("Services").
		Summary("Publishes to MQTT through a durable outbox: a message is fsync'd before the pipeline is told it is done, then published QoS 1 in FIFO order and kept until it is confirmed.").
		Description(`
With the outbox on (the default), `+"`Write`"+` returns once the message is durable in a bbolt file; concurrent writes share one fsync (group commit). A background sender publishes the outbox oldest first, with up to `+"`window`"+` unconfirmed messages on the wire, and deletes a record only after its confirmation:

- `+"`confirm: broker`"+`: the broker's PUBACK. This proves only that the broker accepted the message; brokers can and do drop QoS 1 messages after PUBACK (full queues, offline-session limits).
- `+"`confirm: end_to_end`"+`: the message is published as a reliomq v1 ingress envelope to `+"`data_topic`"+`, and the record is done only when an ACK carrying its exact `+"`event_id`"+` arrives on `+"`ack_topic`"+` — sent by a `+"`reliable_mqtt_in`"+` with `+"`ack_topic`"+` set (a bridge), or by any reliomq bridge.

On a timeout, a disconnect or a publish error the sender resends from the oldest unconfirmed record, so a newer message never overtakes an older one, and nothing is deleted because of a failure. The delivery guarantee is at least once: a message can be published more than once (a lost PUBACK or ACK), always under the same `+"`event_id`"+`, so consumers can deduplicate (see `+"`dedup_ledger`"+`).

The outbox is store-and-forward: writes are accepted while the broker is unreachable, until `+"`outbox.max_pending`"+` or `+"`outbox.max_pending_bytes`"+` is reached; then writes block (backpressure), they are never dropped.

With `+"`outbox.enabled: false`"+` (direct mode) `+"`Write`"+` returns only after the confirmation, or fails after the timeout so that the upstream message is not acknowledged and is retried. Use it for a bridge whose source must only be acknowledged once the destination confirmed.

### Permanent and transient failures

A message that can never be published fails `+"`Write`"+` with an error that starts with `+"`permanent failure: `"+`, and nothing is stored: a payload beyond `+"`max_payload_bytes`"+`, an invalid destination topic or event ID, an `+"`event_id`"+` that evaluates to `+"`null`"+`, a payload that cannot be enveloped. Route those with Benthos's own outputs instead of retrying them: a `+"`fallback`"+` whose next output is a `+"`switch`"+` on `+"`@fallback_error.has_prefix(\"permanent failure\")`"+` (a dead-letter topic), with `+"`reject`"+` for every other error so that the source delivers the message again (see `+"`config/bridge.yaml`"+`). Every other error is transient (no broker connection in direct mode, a disk that fails). A message flagged with an error by a processor is refused (not as permanent): publishing it would pass it on as valid.

An outbox path that can never work (a directory, a path below a file, a file that is not a reliable-mqtt outbox, a file another process holds) fails the component when it is created, so the process stops at start with the message; `+"`confirm`"+`, `+"`envelope`"+`, a static `+"`topic`"+` and `+"`data_topic`"+` are checked then too.

Use `+"`buffer: none`"+` (the default) in reliable pipelines: a buffer acknowledges the input before this output has the message.

With Mosquitto as the broker, set `+"`set_tcp_nodelay true`"+` in its configuration: without it every confirmation round trip can wait tens of milliseconds for Nagle's algorithm.

### MQTT 3.1.1 and MQTT 5

Every field and option applies to both protocol versions unless its description starts with "MQTT 5 only"; those stop the process at start on 3.1.1 (the default). With MQTT 5: `+"`envelope: properties`"+` carries the event ID (and, with `+"`confirm: end_to_end`"+`, the destination topic) as user properties and leaves the payload bytes alone; a PUBACK reason code of 0x80 or more fails the publish (the record stays and is resent after `+"`retry_backoff`"+`; counted in `+"`reliable_mqtt_out_puback_reason_codes{code}`"+`); `+"`require_subscribers`"+` treats 0x10 (no matching subscribers) the same way; the publishes awaiting a PUBACK never exceed the server's Receive Maximum — with `+"`confirm: end_to_end`"+` a message the broker has PUBACKed and that waits for its ACK does not count against it — and when that limit holds the window below what the link could carry, the output logs it once per connection (mosquitto: raise `+"`max_inflight_messages`"+`, which is the Receive Maximum it announces).`).
		Fields(mqttconf.ConnectionFields()...).
		Fields(
			service.NewStringField(fieldClientID).
				Description("MQTT client ID. By default an ID is generated once and stored in the outbox file, so a restarted process resumes its session (and receives the ACKs that arrived while it was away). Without an outbox a random ID and a clean session are used.").
				Default(""),
			service.NewInterpolatedStringField(fieldTopic).
				Description("The destination topic of each message. It must be a valid publish topic: not empty, no `+` or `#` wildcards, no NUL, at most 65535 bytes.").
				Example(`factory/${! meta("machine") }/data`),
			service.NewInterpolatedStringField(fieldRetained).
				Description("Publish with the retain flag: `true`, `false`, or (with `outbox.enabled: false`) an interpolation per message that yields one of them, e.g. `${! meta(\"retain\").or(\"false\") }`. The outbox stores no per-record flag, so with the outbox on it must be a constant (which applies to the records still pending when a process starts with another value). Not allowed with `confirm: end_to_end`: a retained envelope would reach every new subscriber of `data_topic` again. There is no `qos` field: records are published at QoS 1, the only level whose acknowledgement confirms a record — QoS 0 has none (a message lost on the way would be deleted as sent), and QoS 2's extra round trip adds nothing the event ID does not already give the consumer.").
				Default("false").Advanced(),
			service.NewInterpolatedStringField(fieldEventID).
				Description("The message's stable ID (`^[A-Za-z0-9_-]{1,128}$`). When it evaluates to an empty string a new 32-character hex ID is generated once, stored with the record and never regenerated. A write whose event ID is already pending is idempotent when topic, payload and (MQTT 5) properties are identical and fails when they differ. Benthos interpolates missing metadata as the string `null`; such a message is refused (a permanent failure) and nothing is published: write `${! meta(\"event_id\").or(\"\") }` to fall back to a generated ID.").
				Default("").
				Example(`${! meta("event_id").or("") }`),
			service.NewStringAnnotatedEnumField(fieldConfirm, map[string]string{
				confirmBroker:   "A record is done at the broker's PUBACK.",
				confirmEndToEnd: "Publish a reliomq v1 ingress envelope to `data_topic`; a record is done when an ACK with its exact event ID arrives on `ack_topic`.",
			}).Description("What confirms a record.").Default(confirmBroker),
			service.NewStringField(fieldDataTopic).
				Description("With `confirm: end_to_end`: the topic the ingress envelopes are published to (the bridge subscribes to it).").
				Default("reliomq/messages"),
			service.NewStringField(fieldAckTopic).
				Description("With `confirm: end_to_end`: the topic on which ACKs arrive.").
				Default("reliomq/acks"),
		).
		Fields(mqttconf.AckAuthFields("With `confirm: end_to_end`, an ACK confirms a record only when its `auth` is the HMAC-SHA256 of the event ID under this key; any other ACK is ignored and counted in `reliable_mqtt_out_acks_ignored{reason=\"unauthenticated\"}`.")...).
		Fields(
			service.NewStringAnnotatedEnumField(fieldEnvelope, map[string]string{
				envelopeNone:       "With `confirm: broker`, publish the payload bytes unchanged; with `confirm: end_to_end`, the reliomq v1 ingress envelope (JSON payloads only). Both protocol versions.",
				envelopeDelivery:   "With `confirm: broker`: wrap the payload (which must be JSON) in a reliomq v1 delivery envelope carrying the event ID, so the final consumer can deduplicate. Both protocol versions.",
				envelopeProperties: "MQTT 5 only (`protocol_version: \"5\"`): publish the payload bytes unchanged, any bytes, with the event ID as the user property `event_id`; with `confirm: end_to_end` the message goes to `data_topic` with the destination topic as the user property `destination_topic`, and a `reliable_mqtt_in` with `envelope: properties` reads both.",
			}).Description("How the event ID travels with the payload.").Default(envelopeNone),
			traceContextField(),
			service.NewInterpolatedStringMapField(fieldUserProperties).
				Description("MQTT 5 only: user properties to publish with each message, name to interpolated value (stored with the record). The names `event_id` and `destination_topic` are reserved for `envelope: properties`.").
				Default(map[string]any{}).Example(map[string]any{"site": `${! meta("site") }`}).Advanced(),
			service.NewInterpolatedStringField(fieldContentType).
				Description("MQTT 5 only: the content type property of each message (interpolated; empty: none).").
				Default("").Example("application/json").Advanced(),
			service.NewInterpolatedStringField(fieldMessageExpiry).
				Description("MQTT 5 only: the message expiry interval of each message, a duration in whole seconds (`90s`, `1h`) or a number of seconds (interpolated; empty: the message does not expire). The broker discards the message when it has not been delivered within the interval, counted from each publish: time spent in the outbox does not count, and a resend starts it again.").
				Default("").Example("1h").Advanced(),
			service.NewBoolField(fieldRequireSubs).
				Description("MQTT 5 only, with `confirm: broker`: a PUBACK with reason code 0x10 (no matching subscribers) does not confirm the record: it stays in the outbox and is published again after `retry_backoff`, holding up the records behind it (FIFO), until a subscriber exists (direct mode: the write fails and is retried upstream). Not allowed with `confirm: end_to_end`, where only the receiver's ACK confirms a record anyway. It helps only with brokers that send 0x10 (mosquitto does).").
				Default(false).Advanced(),
			service.NewObjectField(fieldOutbox,
				service.NewBoolField(fieldOutboxEnabled).Description("Keep messages in a durable outbox until confirmed. When false, `Write` waits for the confirmation itself (direct mode).").Default(true),
				service.NewStringField(fieldOutboxPath).Description("Path of the bbolt outbox file (required when enabled). One process owns it; it may be shared with a `dedup_ledger` of the same pipeline so that both commit in one transaction.").Default("").Example("./data/outbox.db"),
				service.NewIntField(fieldOutboxMaxCount).Description("At most this many pending records; `Write` blocks while full. 0 means unbounded.").Default(0),
				service.NewIntField(fieldOutboxMaxBytes).Description("At most this many pending bytes; `Write` blocks while full. 0 means unbounded.").Default(0),
				service.NewDurationField(fieldOutboxDelay).Description("How long a write's commit waits for other writes to share its fsync. Longer means fewer bytes written to the disk per message (flash wear: docs/operations.md) and up to this much more latency per write; `0s` commits at once.").Default("0s").Advanced(),
				verifyField(),
			).Description("The durable outbox. Every record carries a CRC-32C checksum checked on every read; a record that fails is never published: it is moved to the file's `outbox/damaged` bucket, logged with its sequence number and counted in `reliable_mqtt_out_damaged_records`, and the records after it go on. A record is written with one commit; its removal after confirmation rides along with a later append's commit (or commits alone after 1 s without one). `reliable_mqtt_out_outbox_written_bytes` counts what bbolt wrote to the file (flash wear: docs/operations.md)."),
			service.NewIntField(fieldWindow).
				Description("The most unconfirmed messages the outbox sender keeps on the wire at once. Below it the sender sizes the window per connection after the link: it starts at, and does not fall below, 64 (or `window`, if smaller; with `pack`, the records of as many full frames as the server's Receive Maximum allows, at most 20, unless the connection before confirmed nothing), grows while confirmed throughput grows with it and settles near twice the link's bandwidth-delay product (delivery rate × minimum round trip), or deeper, up to six times it, where a deeper queue still raises the confirmed rate by 10 % a step, falling again when the link slows; on loopback it stays at that floor. The default fills a 600 ms satellite link. 1 is strict stop-and-wait. The window in use is the gauge `reliable_mqtt_out_window`. In direct mode (no outbox) each write waits for its own confirmation and `max_in_flight` sets how many are in flight.").
				Default(sender.DefaultWindow),
			service.NewDurationField(fieldAckTimeout).
				Description("With `confirm: end_to_end`: how long to wait for a published message's ACK before resending from the oldest unconfirmed message (direct mode: before failing the write).").
				Default("10s"),
			service.NewDurationField(fieldPublishTimeout).
				Description("How long to wait for a PUBACK before resending from the oldest unconfirmed message (direct mode: before failing the write).").
				Default("5s"),
			conffield.BackoffField(fieldRetry, "Delay before resending from the oldest unconfirmed message after a failure.", "100ms", "10s"),
			service.NewIntField(fieldMaxPayloadBytes).
				Description("Writes whose published payload would exceed this many bytes fail with an error instead of being stored.").
				Default(1<<20).Advanced(),
			service.NewDurationField(fieldStatsInterval).
				Description("Log a line with the number of published, confirmed and pending records this often. `0s` turns it off; the same figures are always available as metrics.").
				Default("0s").Advanced(),
			packField(),
			service.NewOutputMaxInFlightField().Default(64),
			service.NewBatchPolicyField(fieldBatching).
				Description("Hand the output messages in batches: with the outbox on, one batch is appended in the transactions of one group commit, so more records share each fsync (see docs/performance.md). A message is still acknowledged only after the fsync that covers it. In direct mode the messages of a batch are published concurrently. Off by default (every message is its own batch)."),
		).
		LintRule(outputLintRule).
		Example("Durable publisher", "Generate readings and publish them through the outbox on the embedded broker.", `
input:
  generate:
    interval: 1s
    mapping: 'root = {"temperature": random_int(min: 15, max: 30)}'
output:
  reliable_mqtt_out:
    urls: [ "embedded://" ]
    topic: factory/machine1/data
    outbox:
      path: ./data/outbox.db
`).
		Example("End-to-end confirmed publisher", "Each message stays in the outbox until a bridge ACKs its event ID.", `
output:
  reliable_mqtt_out:
    urls: [ "tcp://127.0.0.1:1883" ]
    topic: factory/machine1/data
    confirm: end_to_end
    data_topic: reliable/ingress
    ack_topic: reliable/acks
    outbox:
      path: ./data/outbox.db
`)
}

// outputLintRule finds, at `lint` time, the combinations parseSettings
// refuses at start (Benthos runs it on the YAML as written, defaults absent).
const outputLintRule = `
let v5 = this.protocol_version.or("3.1.1") == "5"
let e2e = this.confirm.or("broker") == "end_to_end"
let outbox = this.outbox.enabled.or(true)
let retained = this.retained.or("false").string()
let packed = this.pack.max_events.or(1) > 1
let v5only = [
  if this.envelope.or("") == "properties" { "envelope: properties" },
  if this.user_properties.or({}).length() > 0 { "user_properties" },
  if this.content_type.or("") != "" { "content_type" },
  if this.message_expiry.or("") != "" { "message_expiry" },
  if this.require_subscribers.or(false) { "require_subscribers" },
  if this.session_expiry_interval != null { "session_expiry_interval" },
].filter(v -> v != null)
root = [
  if !$v5 && $v5only.length() > 0 { $v5only.join(", ") + ": MQTT 5 only: set protocol_version: \"5\" (the broker must speak it), or remove them" },
  if this.trace_context.or("properties") == "envelope" && this.envelope.or("none") != "delivery" && (!$e2e || this.envelope.or("") == "properties") { "trace_context: envelope needs a reliomq v1 envelope to carry it: envelope: delivery, or confirm: end_to_end without envelope: properties" },
  if $e2e && this.envelope.or("") == "delivery" { "envelope: delivery applies to confirm: broker; end_to_end sends the ingress envelope (or, with envelope: properties, user properties)" },
  if $e2e && this.require_subscribers.or(false) { "require_subscribers applies to confirm: broker; with confirm: end_to_end only the receiver's ACK confirms a record" },
  if $e2e && $retained != "false" { "retained does not apply to confirm: end_to_end: a retained envelope would reach every new subscriber of data_topic again" },
  if $outbox && $retained.contains("${!") { "retained: an interpolation needs outbox.enabled: false (the outbox stores no flag per record); use true or false" },
  if $outbox && this.outbox.path.or("") == "" { "outbox.path is required while outbox.enabled is true (or set outbox.enabled: false for direct mode)" },
  if !$e2e && (this.ack_auth_key.or("") != "" || !["[]", "null"].contains(this.ack_auth_keys.or([]).string())) { "ack_auth_key applies to confirm: end_to_end only (confirm: broker receives no ACKs)" },
  if this.user_properties.or({}).keys().contains("event_id") { "user_properties: \"event_id\" is reserved for envelope: properties" },
  if this.user_properties.or({}).keys().contains("destination_topic") { "user_properties: \"destination_topic\" is reserved for envelope: properties" },
  if $packed && !$e2e && this.envelope.or("none") == "none" { "pack: with confirm: broker and envelope: none any subscriber reads the topic, and a plain subscriber cannot read frames; use envelope: delivery or properties, or confirm: end_to_end" },
  if $packed && (this.content_type.or("") != "" || this.message_expiry.or("") != "") { "pack: a frame carries user properties only; content_type and message_expiry need pack.max_events: 1" },
  if $packed && $retained != "false" { "pack: a retained frame would keep several events as the topic's one retained message; set retained: false or pack.max_events: 1" },
].filter(v -> v != null)
`

func init() {
	err := service.RegisterBatchOutput("reliable_mqtt_out", outputSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchOutput, service.BatchPolicy, int, error) {
			maxInFlight, err := conf.FieldMaxInFlight()
			if err != nil {
				return nil, service.BatchPolicy{}, 0, err
			}
			policy, err := conf.FieldBatchPolicy(fieldBatching)
			if err != nil {
				return nil, service.BatchPolicy{}, 0, err
			}
			o, err := newOutput(conf, mgr)
			return o, policy, maxInFlight, err
		})
	if err != nil {
		panic(err)
	}
}

// settings is the parsed, validated configuration: what the write path
// needs (sender.Options) and what the plugin interpolates per message.
type settings struct {
	sender        sender.Options
	topic         *service.InterpolatedString
	eventID       *service.InterpolatedString
	retained      *service.InterpolatedString // nil: the constant retainedConst
	retainedConst bool
	v5            v5Fields
	statsInterval time.Duration
}

func parseSettings(conf *service.ParsedConfig) (s settings, err error) {
	o := &s.sender
	if o.Client, err = mqttconf.ParseConfig(conf); err != nil {
		return s, err
	}
	if o.Client.ClientID, err = conf.FieldString(fieldClientID); err != nil {
		return s, err
	}
	if s.topic, err = conf.FieldInterpolatedString(fieldTopic); err != nil {
		return s, err
	}
	if s.eventID, err = conf.FieldInterpolatedString(fieldEventID); err != nil {
		return s, err
	}
	if raw, err := conf.FieldString(fieldTopic); err == nil && !strings.Contains(raw, "${!") {
		// A static topic is checked now rather than on every message.
		if err := envelope.CheckPublishTopic(raw); err != nil {
			return s, fmt.Errorf("topic %q: %w", raw, err)
		}
	}
	var confirm, env, dataTopic, ackTopic string
	err = conffield.Read(conf, conffield.Enum(&confirm, fieldConfirm, confirmBroker, confirmEndToEnd),
		conffield.Enum(&env, fieldEnvelope, envelopeNone, envelopeDelivery, envelopeProperties),
		conffield.String(&dataTopic, fieldDataTopic), conffield.String(&ackTopic, fieldAckTopic))
	if err != nil {
		return s, err
	}
	endToEnd := confirm == confirmEndToEnd
	if endToEnd && env == envelopeDelivery {
		return s, errors.New("envelope: delivery applies to confirm: broker; end_to_end sends the ingress envelope (or, with envelope: properties, user properties)")
	}
	traceEnvelope, err := parseTraceContext(conf, env, endToEnd)
	if err != nil {
		return s, err
	}
	if s.v5, err = parseV5Fields(conf, o.Client.ProtocolVersion, env == envelopeProperties, endToEnd); err != nil {
		return s, err
	}
	o.RequireSubscribers = s.v5.requireSubscribers
	if endToEnd {
		// Publishing to a wildcard is refused by the broker with a dropped
		// connection, which would look like an endless outage.
		if err := envelope.CheckPublishTopic(dataTopic); err != nil {
			return s, fmt.Errorf("data_topic %q: %w", dataTopic, err)
		}
		if ackTopic == "" {
			return s, errors.New("ack_topic must not be empty with confirm: end_to_end")
		}
	}
	ackAuthKeys, err := mqttconf.ParseAckAuthKeys(conf)
	if err != nil {
		return s, err
	}
	if ackAuthKeys != nil && !endToEnd {
		return s, errors.New("ack_auth_key applies to confirm: end_to_end only (confirm: broker receives no ACKs)")
	}
	outboxOn, err := conf.FieldBool(fieldOutbox, fieldOutboxEnabled)
	if err != nil {
		return s, err
	}
	if o.OutboxPath, err = conf.FieldString(fieldOutbox, fieldOutboxPath); err != nil {
		return s, err
	}
	if outboxOn && o.OutboxPath == "" {
		return s, errors.New("outbox.path is required while outbox.enabled is true (or set outbox.enabled: false for direct mode)")
	}
	if !outboxOn {
		o.OutboxPath = "" // direct mode
	}
	if o.Outbox.MaxPending, err = conffield.FieldIntIn(conf, 0, math.MaxInt, fieldOutbox, fieldOutboxMaxCount); err != nil {
		return s, err
	}
	maxBytes, err := conffield.FieldIntIn(conf, 0, math.MaxInt, fieldOutbox, fieldOutboxMaxBytes)
	if err != nil {
		return s, err
	}
	o.Outbox.MaxPendingBytes = int64(maxBytes)
	if o.Outbox.CommitDelay, err = conf.FieldDuration(fieldOutbox, fieldOutboxDelay); err != nil {
		return s, err
	}
	if o.Outbox.CommitDelay < 0 {
		return s, errors.New("outbox.commit_delay must not be negative")
	}
	verify, err := conffield.FieldEnum(conf.Namespace(fieldOutbox), fieldOutboxVerify, boltfile.VerifyValues...)
	if err != nil {
		return s, fmt.Errorf("outbox.%w", err)
	}
	o.Outbox.Verify = boltfile.Verify(verify)
	if o.Window, err = conffield.FieldIntIn(conf, 1, math.MaxInt, fieldWindow); err != nil {
		return s, err
	}
	ackTimeout, err := conffield.FieldPositiveDuration(conf, fieldAckTimeout)
	if err != nil {
		return s, err
	}
	if o.PublishTimeout, err = conffield.FieldPositiveDuration(conf, fieldPublishTimeout); err != nil {
		return s, err
	}
	if o.Retry, err = conffield.ParseBackoff(conf, fieldRetry); err != nil {
		return s, err
	}
	maxPayloadBytes, err := conffield.FieldIntIn(conf, 1, maxMQTTPayload, fieldMaxPayloadBytes)
	if err != nil {
		return s, err
	}
	if s.statsInterval, err = conf.FieldDuration(fieldStatsInterval); err != nil {
		return s, err
	}
	// The confirmation strategy is chosen here, once.
	o.Confirm = sender.ByPuback()
	if endToEnd {
		o.Confirm = sender.ByAck(ackTopic, ackTimeout, ackAuthKeys)
	}
	o.Encoding = codec.Encoding{Mode: env, EndToEnd: endToEnd, DataTopic: dataTopic, MaxPayloadBytes: maxPayloadBytes, TraceContext: traceEnvelope}
	if err := s.parseRetained(conf, outboxOn, endToEnd); err != nil { // after outbox and confirm
		return s, err
	}
	o.Retained = s.retainedConst
	if o.Pack, err = parsePack(conf, maxPayloadBytes); err != nil {
		return s, err
	}
	if o.Pack.MaxEvents > 1 {
		if err := checkPackable(o, s.v5, s.retained != nil); err != nil {
			return s, err
		}
	}
	return s, nil
}

// parseRetained reads retained: a constant, or an interpolation evaluated
// per message in direct mode (the outbox keeps no flag per record).
func (s *settings) parseRetained(conf *service.ParsedConfig, outboxOn, endToEnd bool) error {
	raw, err := conf.FieldString(fieldRetained)
	if err != nil {
		return err
	}
	if !strings.Contains(raw, "${!") {
		if s.retainedConst, err = strconv.ParseBool(raw); err != nil {
			return fmt.Errorf("retained: %q is neither true nor false", raw)
		}
	} else {
		if outboxOn {
			return errors.New("retained: an interpolation needs outbox.enabled: false (the outbox stores no flag per record); use true or false")
		}
		if s.retained, err = conf.FieldInterpolatedString(fieldRetained); err != nil {
			return err
		}
	}
	if endToEnd && (s.retainedConst || s.retained != nil) {
		return errors.New("retained does not apply to confirm: end_to_end: a retained envelope would reach every new subscriber of data_topic again")
	}
	return nil
}

// verifyField is outbox.verify_on_start.
func verifyField() *service.ConfigField {
	return service.NewStringAnnotatedEnumField(fieldOutboxVerify, map[string]string{
		string(boltfile.VerifyAuto):   fmt.Sprintf("Check files up to %d MiB.", boltfile.AutoVerifyMaxBytes>>20),
		string(boltfile.VerifyAlways): "Check the file whatever its size.",
		string(boltfile.VerifyNever):  "Do not check; rely on the per-record checksums.",
	}).Description("At start, read every page of an existing outbox file, run bbolt's consistency check and compare the records with the stored count, refusing a damaged file before anything is published. The cost grows with the file (see docs/operations.md).").
		Default(string(boltfile.VerifyAuto)).Advanced()
}
