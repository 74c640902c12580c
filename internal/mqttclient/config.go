package mqttclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
)

// Will is the last-will message the broker publishes if the connection dies
// without a DISCONNECT.
type Will struct {
	Topic    string
	Payload  []byte
	QoS      byte
	Retained bool
}

// Config is everything needed to reach a broker.
type Config struct {
	URLs           []string
	ClientID       string
	User           string
	Password       string
	TLS            *tls.Config // nil: plain connections
	KeepAlive      time.Duration
	ConnectTimeout time.Duration
	Will           *Will
	// Reconnect is the delay between connection attempts; the client never
	// gives up on its own.
	Reconnect    backoff.Backoff
	CleanSession bool
	// ProtocolVersion is V311 (also the zero value) or V5.
	ProtocolVersion string
	// SessionExpiry is the MQTT 5 session expiry interval sent in CONNECT
	// (whole seconds; 0 ends the session with the connection).
	// SessionNeverExpires keeps it forever, as a 3.1.1 persistent session;
	// SessionExpiryDefault (what the plugins' config parser returns when
	// the field is unset) is SessionNeverExpires without CleanSession and 0 with it.
	SessionExpiry time.Duration
	// ReceiveMaximum is the MQTT 5 Receive Maximum sent in CONNECT: how many
	// unacknowledged QoS 1/2 messages the broker may send at once. 0 sends
	// none (the protocol's default, 65535).
	ReceiveMaximum uint16
}

// SessionNeverExpires is the session expiry interval 0xFFFFFFFF seconds.
const SessionNeverExpires = time.Duration(0xFFFFFFFF) * time.Second

// SessionExpiryDefault makes the session expiry follow CleanSession: a
// persistent session (CleanSession false) never expires, as in 3.1.1, and
// a clean one ends with the connection.
const SessionExpiryDefault time.Duration = -1

// sessionExpiry is the interval CONNECT carries, in whole seconds.
func (c Config) sessionExpiry() uint32 {
	d := c.SessionExpiry
	if d < 0 {
		if c.CleanSession {
			return 0
		}
		d = SessionNeverExpires
	}
	return uint32(min(d/time.Second, SessionNeverExpires/time.Second))
}

// Validate checks what can be checked without a broker.
func (c Config) Validate() error {
	if len(c.URLs) == 0 {
		return errors.New("urls: at least one broker URL is required")
	}
	switch c.ProtocolVersion {
	case "", V311, V5:
	default:
		return fmt.Errorf("protocol_version: %q is not one of %s, %s", c.ProtocolVersion, V311, V5)
	}
	for _, raw := range c.URLs {
		u, err := url.Parse(raw)
		if err != nil {
			return fmt.Errorf("urls: %q is not a URL: %w", raw, err)
		}
		switch u.Scheme {
		case "tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss":
		case "embedded":
			// A client starts no broker: embedded.StartClient starts it and
			// hands the client its address (embedded.CheckConfig checks the
			// URL with the rest of the config).
			return fmt.Errorf("urls: %q names a broker this process starts: start the client with embedded.StartClient", raw)
		default:
			return fmt.Errorf("urls: %q has scheme %q; use tcp://, ssl://, ws://, wss:// or embedded://", raw, u.Scheme)
		}
	}
	if c.Will != nil && c.Will.Topic == "" {
		return errors.New("will.topic must be set when will.enabled is true")
	}
	if c.ConnectTimeout <= 0 {
		return errors.New("connect_timeout must be positive")
	}
	return c.Reconnect.Check("reconnect_backoff")
}
