// Package mqttconf is the Benthos side of an MQTT connection: the spec
// fields every reliable-mqtt MQTT component shares (broker URLs,
// credentials, TLS, keepalive, will, reconnect backoff, protocol version,
// end-to-end ACK keys) and their parsing into an mqttclient.Config. It
// keeps internal/mqttclient free of Benthos: the client takes a Config
// and a small Logger, and this package fills both from a component's
// configuration and resources.
package mqttconf

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/benthoslog"
	"github.com/reliable-mqtt/reliable-mqtt/internal/embedded"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/conffield"
)

// Field names shared by every MQTT component of reliable-mqtt. They match the
// names of Benthos's own MQTT components where one exists.
const (
	FieldURLs           = "urls"
	FieldUser           = "user"
	FieldPassword       = "password"
	FieldTLS            = "tls"
	FieldKeepAlive      = "keepalive"
	FieldConnectTimeout = "connect_timeout"
	FieldWill           = "will"
	FieldWillEnabled    = "enabled"
	FieldWillTopic      = "topic"
	FieldWillPayload    = "payload"
	FieldWillQoS        = "qos"
	FieldWillRetained   = "retained"
	FieldReconnect      = "reconnect_backoff"
	FieldProtocol       = "protocol_version"
	FieldSessionExpiry  = "session_expiry_interval"
)

// ConnectionFields are the spec fields every MQTT component shares, except
// client_id, whose meaning differs between the input (required, it names a
// persistent session) and the output (generated and stored in the outbox).
func ConnectionFields() []*service.ConfigField {
	return []*service.ConfigField{
		service.NewStringListField(FieldURLs).
			Description("Broker URLs, tried in order: `tcp://host:1883`, `ssl://host:8883`, `ws://host:80/mqtt`, `wss://...`, or `embedded://` for the in-process broker (query parameters `dir` for its data directory and `listen` for a TCP listener other processes can reach, e.g. `embedded://?dir=./data/broker&listen=127.0.0.1:1883`; for that listener `users` names a mosquitto password file (bcrypt or `$7$` hashes) clients must log in with, `acl` a YAML file of per-user topic rights (`user: {read: [filters], write: [filters]}`, the rest denied), `tls_cert` and `tls_key` serve it over TLS; a `listen` address that is not loopback is refused without `users`).").
			Example([]string{"tcp://127.0.0.1:1883"}).
			Example([]string{"embedded://"}),
		service.NewStringField(FieldUser).
			Description("Username for the broker.").Default("").Advanced(),
		service.NewStringField(FieldPassword).
			Description("Password for the broker.").Default("").Secret().Advanced(),
		service.NewTLSToggledField(FieldTLS),
		service.NewDurationField(FieldKeepAlive).
			Description("MQTT keepalive: the interval of PINGREQs on an idle connection. It bounds how long a broker that dies silently (a power cut, a black-holed link) goes unnoticed: with the default, about 15 s at most with no traffic, when readiness and the connected gauges turn; raise it to save traffic on metered links. A plain number is seconds (`30`), as in Benthos's `mqtt` components.").
			Default("5s").Advanced(),
		service.NewDurationField(FieldConnectTimeout).
			Description("How long one connection attempt (TCP, TLS and CONNACK) may take.").
			Default("10s").Advanced(),
		service.NewObjectField(FieldWill,
			service.NewBoolField(FieldWillEnabled).Description("Whether to set a last will.").Default(false),
			service.NewStringField(FieldWillTopic).Description("Topic of the last will.").Default(""),
			service.NewStringField(FieldWillPayload).Description("Payload of the last will.").Default(""),
			service.NewIntField(FieldWillQoS).Description("QoS of the last will.").Default(0),
			service.NewBoolField(FieldWillRetained).Description("Whether the last will is retained.").Default(false),
		).Description("A last-will message the broker publishes when this client's connection dies without a clean disconnect.").Advanced(),
		conffield.BackoffField(FieldReconnect, "Delay between connection attempts. The client reconnects by itself forever; connectivity shows in logs and metrics.", "250ms", "10s"),
		// A plain string, not an enum field: Benthos's linter reads an
		// option with dots as a path, so it would refuse "3.1.1".
		service.NewStringField(FieldProtocol).
			Description("The MQTT protocol version: `\"3.1.1\"` or `\"5\"` (quoted, as YAML would otherwise read a number). Every other connection field applies to both, except `" + FieldSessionExpiry + "` (MQTT 5 only). With `5`, the broker's CONNACK limits are honoured (Receive Maximum, Maximum QoS, Retain Available, Maximum Packet Size: a message the broker would refuse is refused before it is sent) and PUBACK/SUBACK reason codes are reported.").
			Default(mqttclient.V311).Advanced(),
		service.NewDurationField(FieldSessionExpiry).
			Description("MQTT 5 only: how long the broker keeps this client's session (subscriptions and queued messages) after a disconnect; sent in CONNECT in whole seconds. Unset (the default): a persistent session never expires, as in 3.1.1, and a clean session ends with the connection (`reliable_mqtt_in`: `clean_session`; `reliable_mqtt_out`: persistent with a stable client ID, clean without). `0s` ends it with the connection. Setting it with `protocol_version: 3.1.1` is an error.").
			Optional().Advanced(),
	}
}

// ParseConfig reads the fields of ConnectionFields. The caller fills ClientID
// and CleanSession.
func ParseConfig(pc *service.ParsedConfig) (mqttclient.Config, error) {
	var c mqttclient.Config
	var err error
	if c.URLs, err = pc.FieldStringList(FieldURLs); err != nil {
		return c, err
	}
	if c.User, err = pc.FieldString(FieldUser); err != nil {
		return c, err
	}
	if c.Password, err = pc.FieldString(FieldPassword); err != nil {
		return c, err
	}
	tlsConf, tlsOn, err := pc.FieldTLSToggled(FieldTLS)
	if err != nil {
		return c, err
	}
	if tlsOn {
		c.TLS = tlsConf
	}
	if c.KeepAlive, err = parseKeepAlive(pc); err != nil {
		return c, err
	}
	if c.ConnectTimeout, err = pc.FieldDuration(FieldConnectTimeout); err != nil {
		return c, err
	}
	if c.Reconnect, err = conffield.ParseBackoff(pc, FieldReconnect); err != nil {
		return c, err
	}
	if c.ProtocolVersion, err = conffield.FieldEnum(pc, FieldProtocol, mqttclient.V311, mqttclient.V5); err != nil {
		return c, err
	}
	c.SessionExpiry = mqttclient.SessionExpiryDefault
	if pc.Contains(FieldSessionExpiry) {
		if c.ProtocolVersion != mqttclient.V5 {
			return c, fmt.Errorf("%s applies to MQTT 5 only: set %s: \"5\" or remove it", FieldSessionExpiry, FieldProtocol)
		}
		if c.SessionExpiry, err = pc.FieldDuration(FieldSessionExpiry); err != nil {
			return c, err
		}
		if c.SessionExpiry < 0 {
			return c, fmt.Errorf("%s: %s is negative", FieldSessionExpiry, c.SessionExpiry)
		}
	}
	willOn, err := pc.FieldBool(FieldWill, FieldWillEnabled)
	if err != nil {
		return c, err
	}
	if willOn {
		w := &mqttclient.Will{}
		if w.Topic, err = pc.FieldString(FieldWill, FieldWillTopic); err != nil {
			return c, err
		}
		payload, err := pc.FieldString(FieldWill, FieldWillPayload)
		if err != nil {
			return c, err
		}
		w.Payload = []byte(payload)
		qos, err := pc.FieldInt(FieldWill, FieldWillQoS)
		if err != nil {
			return c, err
		}
		if qos < 0 || qos > 2 {
			return c, fmt.Errorf("will.qos must be 0, 1 or 2, got %d", qos)
		}
		w.QoS = byte(qos)
		if w.Retained, err = pc.FieldBool(FieldWill, FieldWillRetained); err != nil {
			return c, err
		}
		c.Will = w
	}
	return c, embedded.CheckConfig(c)
}

// parseKeepAlive reads keepalive as a duration ("30s") or, as users of
// Benthos's mqtt components write it, a whole number of seconds (30).
func parseKeepAlive(pc *service.ParsedConfig) (time.Duration, error) {
	raw, err := pc.FieldString(FieldKeepAlive)
	if err != nil {
		return 0, err
	}
	if secs, err := strconv.Atoi(raw); err == nil {
		if secs < 0 {
			return 0, fmt.Errorf("keepalive: %d seconds is negative", secs)
		}
		return time.Duration(secs) * time.Second, nil
	}
	return pc.FieldDuration(FieldKeepAlive)
}

// ClientStarter starts the client of a component that logs through log,
// with the embedded brokers its URLs name beside it (embedded.StartClient):
// the client's lines and the brokers' follow the component's logger (level
// and format of the config's logger section).
func ClientStarter(log *service.Logger, manualAck bool) mqttclient.Starter {
	return func(cfg mqttclient.Config, h mqttclient.Handlers) (mqttclient.Transport, error) {
		if log == nil {
			return embedded.StartClient(cfg, h, mqttclient.Options{ManualAck: manualAck})
		}
		return embedded.StartClient(cfg, h, mqttclient.Options{ManualAck: manualAck, Logger: log}, embedded.WithLog(benthoslog.Handler(log)))
	}
}
