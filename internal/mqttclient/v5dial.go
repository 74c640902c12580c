package mqttclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session/state"
)

// dialV5 makes one MQTT 5 connection attempt: each URL in order, each with
// its own connect_timeout (a node that accepts TCP and never answers must
// not use up the attempt).
func (c *Client) dialV5(gen uint64, closing <-chan struct{}) (conn, error) {
	var errs []error
	for _, u := range c.brokerURLs {
		conn, err := c.tryV5(gen, u, closing)
		if err == nil {
			conn.broker = u
			return conn, nil
		}
		select {
		case <-closing:
			return nil, ErrClosed
		default:
		}
		errs = append(errs, fmt.Errorf("%s: %w", u, err))
	}
	return nil, errors.Join(errs...)
}

// tryV5 dials raw and sends CONNECT, bounded by connect_timeout.
func (c *Client) tryV5(gen uint64, raw string, closing <-chan struct{}) (*v5Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ConnectTimeout)
	defer cancel()
	go func() {
		select {
		case <-closing:
			cancel()
		case <-ctx.Done():
		}
	}()

	nc, err := dialURL(ctx, raw, c.cfg.TLS)
	if err != nil {
		return nil, err
	}
	conn := &v5Conn{
		link:   newLink(gen),
		net:    packets.NewThreadSafeConn(nc),
		pinger: paho.NewDefaultPinger(),
		wake:   make(chan struct{}, 1),
		log:    c.log,
	}
	conn.session = &v5Session{State: state.NewInMemory(), manual: c.opts.ManualAck, noSubs: map[uint16]bool{},
		// Before paho starts delivering: OnMessage may read them at once.
		onConnack: func(ca *packets.Connack) {
			conn.sessionPresent = ca.SessionPresent
			conn.limits = serverLimits(paho.ConnackFromPacketConnack(ca))
		}}
	if c.h.OnPubrel != nil {
		conn.session.onPubrel = func(id uint16) { c.h.OnPubrel(conn, id) }
	}
	cc := paho.ClientConfig{
		ClientID:    c.cfg.ClientID,
		Conn:        conn.net,
		Session:     conn.session,
		PingHandler: conn.pinger,
		// Bounds CONNECT and SUBSCRIBE only (publishes bypass paho's
		// Publish); both also have their own contexts.
		PacketTimeout: c.cfg.ConnectTimeout,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(r paho.PublishReceived) (bool, error) {
				if c.h.OnMessage != nil {
					c.h.OnMessage(conn, &v5Message{conn: conn, p: r.Packet, props: messageProperties(r.Packet.Properties)})
				}
				return true, nil
			},
		},
		OnServerDisconnect: func(d *paho.Disconnect) {
			reason := ""
			if d.Properties != nil {
				reason = d.Properties.ReasonString
			}
			if reason == "" {
				reason = (&packets.Disconnect{ReasonCode: d.ReasonCode}).Reason()
			}
			conn.log.Warnf("MQTT server sent DISCONNECT with reason code 0x%02x: %s", d.ReasonCode, reason)
			conn.markLost()
		},
		OnClientError: func(err error) {
			conn.log.Debugf("MQTT connection lost: %v", err)
			conn.markLost()
		},
	}
	conn.cli = paho.NewClient(cc)

	ca, err := conn.cli.Connect(ctx, c.connectPacket())
	if err != nil {
		_ = nc.Close()
		if ca != nil && ca.ReasonCode >= 0x80 {
			e := &ReasonCodeError{Packet: "CONNACK", Code: ca.ReasonCode}
			if ca.Properties != nil {
				e.Reason = ca.Properties.ReasonString
			}
			if e.Reason == "" {
				e.Reason = (&packets.Connack{ReasonCode: ca.ReasonCode}).Reason()
			}
			return nil, e
		}
		if ctx.Err() != nil && err == ctx.Err() {
			return nil, fmt.Errorf("no CONNACK within connect_timeout %s", c.cfg.ConnectTimeout)
		}
		return nil, err
	}
	// paho's client ends with the network connection; so does the Conn.
	go func() {
		select {
		case <-conn.cli.Done():
			conn.markLost()
		case <-conn.Lost():
		}
	}()
	go conn.sendLoop()
	return conn, nil
}

// connectPacket is the CONNECT of every attempt.
func (c *Client) connectPacket() *paho.Connect {
	cp := &paho.Connect{
		ClientID:     c.cfg.ClientID,
		CleanStart:   c.cfg.CleanSession,
		KeepAlive:    uint16(min(c.cfg.KeepAlive/time.Second, math.MaxUint16)),
		Username:     c.cfg.User,
		UsernameFlag: c.cfg.User != "",
		Password:     []byte(c.cfg.Password),
		PasswordFlag: c.cfg.Password != "",
		// Reason strings on failures; and mochi v2.7.9 (embedded://) leaves
		// user properties out of PUBLISH packets to a client that says 0.
		Properties: &paho.ConnectProperties{RequestProblemInfo: true},
	}
	if expiry := c.cfg.sessionExpiry(); expiry > 0 {
		cp.Properties.SessionExpiryInterval = &expiry
	}
	if c.cfg.ReceiveMaximum > 0 {
		rm := c.cfg.ReceiveMaximum
		cp.Properties.ReceiveMaximum = &rm
	}
	if w := c.cfg.Will; w != nil {
		cp.WillMessage = &paho.WillMessage{Topic: w.Topic, Payload: w.Payload, QoS: w.QoS, Retain: w.Retained}
	}
	return cp
}

// serverLimits reads the CONNACK's limits, with the protocol's defaults
// for what it leaves out.
func serverLimits(ca *paho.Connack) ServerLimits {
	l := NoLimits
	p := ca.Properties
	if p == nil {
		return l
	}
	if p.ReceiveMaximum != nil {
		l.ReceiveMaximum = *p.ReceiveMaximum
	}
	if p.MaximumQoS != nil {
		l.MaximumQoS = *p.MaximumQoS
	}
	if p.MaximumPacketSize != nil {
		l.MaximumPacketSize = *p.MaximumPacketSize
	}
	l.RetainAvailable = p.RetainAvailable
	return l
}

// dialURL opens the network connection for one broker URL: tcp:// (also
// mqtt://), ssl:// (also tls://, mqtts://) with tlsConf, ws:// or wss://.
func dialURL(ctx context.Context, raw string, tlsConf *tls.Config) (net.Conn, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	switch u.Scheme {
	case "tcp", "mqtt":
		var d net.Dialer
		return d.DialContext(ctx, "tcp", hostPort(u, "1883"))
	case "ssl", "tls", "mqtts":
		if tlsConf == nil {
			tlsConf = &tls.Config{}
		}
		d := tls.Dialer{Config: tlsConf}
		return d.DialContext(ctx, "tcp", hostPort(u, "8883"))
	case "ws":
		return dialWebSocket(ctx, raw, nil)
	case "wss":
		return dialWebSocket(ctx, raw, tlsConf)
	default:
		return nil, fmt.Errorf("scheme %q is not supported", u.Scheme)
	}
}

func hostPort(u *url.URL, port string) string {
	if u.Port() != "" {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), port)
}
