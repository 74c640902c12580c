package mqttclient

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

// v3Message is a paho.mqtt.golang message: MQTT 3.1.1 has no properties.
type v3Message struct{ paho.Message }

func (v3Message) Properties() *mqttmsg.Properties { return nil }

// pubrelStore is paho's memory store that reports PUBRELs: paho puts an
// inbound PUBREL into its store on arrival, and offers no other hook.
type pubrelStore struct {
	*paho.MemoryStore
	onPubrel func(id uint16)
}

func (s *pubrelStore) Put(key string, m packets.ControlPacket) {
	if rel, ok := m.(*packets.PubrelPacket); ok && strings.HasPrefix(key, "i.") {
		s.onPubrel(rel.MessageID)
	}
	s.MemoryStore.Put(key, m)
}

// v311Conn is one MQTT 3.1.1 connection: one paho.mqtt.golang client.
type v311Conn struct {
	link
	paho paho.Client
	log  Logger
}

var _ Conn = (*v311Conn)(nil)

// Publish sends one message and waits, bounded by ctx, for its completion
// (PUBACK for QoS 1, PUBCOMP for QoS 2, the write for QoS 0).
func (c *v311Conn) Publish(ctx context.Context, p mqttmsg.Publication) error {
	if !c.Alive() {
		return ErrNotConnected
	}
	return c.wait(ctx, c.PublishAsync(p))
}

// PublishAsync starts a publish and returns its token.
func (c *v311Conn) PublishAsync(p mqttmsg.Publication) Token {
	if p.Props != nil {
		return failedToken{ErrNeedsV5}
	}
	return c.paho.Publish(p.Topic, p.QoS, p.Retained, p.Payload)
}

// Limits are NoLimits: MQTT 3.1.1 has no way to state any.
func (c *v311Conn) Limits() ServerLimits { return NoLimits }

// Subscribe subscribes to filters and waits, bounded by ctx, for the SUBACK.
// A filter the broker refuses (return code 0x80) is an error, and so is a
// code MQTT 3.1.1 does not define; a refusal of the packet ID (0x91, which
// the embedded broker sends) is retried under the next one (subscribe.go).
func (c *v311Conn) Subscribe(ctx context.Context, filters map[string]byte) error {
	if len(filters) == 0 {
		return nil
	}
	names := keys(filters)
	slices.Sort(names)
	return subscribeRetryingInUse(ctx, c.log, names, func() error { return c.subscribeOnce(ctx, names, filters) })
}

// subscribeOnce sends one SUBSCRIBE and waits for its SUBACK.
func (c *v311Conn) subscribeOnce(ctx context.Context, names []string, filters map[string]byte) error {
	tok := c.paho.SubscribeMultiple(filters, nil)
	if err := c.wait(ctx, tok); err != nil {
		return fmt.Errorf("subscribe %v: %w", names, err)
	}
	st, ok := tok.(*paho.SubscribeToken)
	if !ok {
		return nil
	}
	codes := st.Result()
	for _, f := range names {
		switch code := codes[f]; {
		case code <= 2:
		case code == 0x80:
			return fmt.Errorf("subscribe: the broker refused filter %q (SUBACK 0x80): check its ACLs and the filter syntax", f)
		case code == reasonPacketIDInUse:
			return fmt.Errorf("subscribe: %w", &ReasonCodeError{Packet: "SUBACK", Code: code, Filter: f, Reason: "packet identifier in use"})
		default:
			return fmt.Errorf("subscribe: the broker answered filter %q with SUBACK code 0x%02x, which MQTT 3.1.1 does not define", f, code)
		}
	}
	return nil
}

// disconnect: on Close paho gets 250 ms to write what it was already
// handed (acks); a lost connection has nothing left to flush.
func (c *v311Conn) disconnect(closing bool) {
	quiesce := uint(0)
	if closing {
		quiesce = 250
	}
	c.paho.Disconnect(quiesce)
}

func keys(m map[string]byte) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// pingTimeout is how long a PINGRESP may take: connect_timeout, but no
// more than the keepalive, so a silent broker is noticed within about two
// keepalives (paho.golang's pinger, used for MQTT 5, waits one keepalive).
func (c *Client) pingTimeout() time.Duration {
	if c.cfg.KeepAlive > 0 && c.cfg.KeepAlive < c.cfg.ConnectTimeout {
		return c.cfg.KeepAlive
	}
	return c.cfg.ConnectTimeout
}

// dialV311 makes one MQTT 3.1.1 connection attempt with a fresh paho client.
func (c *Client) dialV311(gen uint64, closing <-chan struct{}) (conn, error) {
	conn := &v311Conn{link: newLink(gen), log: c.log}
	o := paho.NewClientOptions().
		// Explicit 3.1.1: otherwise paho retries a node that did not answer
		// with MQTT 3.1, a second connect_timeout for each silent node.
		SetProtocolVersion(4).
		SetClientID(c.cfg.ClientID).
		SetCleanSession(c.cfg.CleanSession).
		SetUsername(c.cfg.User).
		SetPassword(c.cfg.Password).
		SetKeepAlive(c.cfg.KeepAlive).
		SetPingTimeout(c.pingTimeout()).
		SetConnectTimeout(c.cfg.ConnectTimeout).
		SetWriteTimeout(c.cfg.ConnectTimeout).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetResumeSubs(false).
		// Receive order is needed to PUBACK in order (MQTT 3.1.1 §4.6);
		// OnMessage is therefore required never to block.
		SetOrderMatters(true).
		SetAutoAckDisabled(c.opts.ManualAck).
		SetCustomOpenConnectionFn(openBuffered). // packets leave in fewer write(2)s (bufconn.go)
		SetConnectionNotificationHandler(func(_ paho.Client, n paho.ConnectionNotification) {
			// The last node tried is the one a successful attempt reached;
			// read after the token completes.
			if b, ok := n.(paho.ConnectionNotificationBroker); ok {
				conn.broker = b.Broker.String()
			}
		}).
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			if err != nil {
				c.log.Debugf("MQTT connection lost: %v", err)
			}
			conn.markLost()
		})
	for _, u := range c.brokerURLs {
		o.AddBroker(u)
	}
	if c.cfg.TLS != nil {
		o.SetTLSConfig(c.cfg.TLS)
	}
	if w := c.cfg.Will; w != nil {
		o.SetBinaryWill(w.Topic, w.Payload, w.QoS, w.Retained)
	}
	if c.h.OnMessage != nil {
		o.SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) { c.h.OnMessage(conn, v3Message{m}) })
	}
	if c.h.OnPubrel != nil {
		o.SetStore(&pubrelStore{MemoryStore: paho.NewMemoryStore(), onPubrel: func(id uint16) { c.h.OnPubrel(conn, id) }})
	}
	conn.paho = paho.NewClient(o)

	// paho tries the URLs in order, each with its own connect_timeout, so
	// a node that accepts TCP and never answers must not use up the whole
	// attempt before the next URL is tried.
	tok := conn.paho.Connect()
	select {
	case <-tok.Done():
	case <-time.After(time.Duration(len(c.brokerURLs))*c.cfg.ConnectTimeout + time.Second):
		conn.paho.Disconnect(0)
		return nil, errors.New("connect timed out")
	case <-closing:
		conn.paho.Disconnect(0)
		return nil, ErrClosed
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	if ct, ok := tok.(*paho.ConnectToken); ok {
		conn.sessionPresent = ct.SessionPresent()
	}
	return conn, nil
}
