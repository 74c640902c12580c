package mqttclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// dialWebSocket opens an MQTT-over-WebSocket connection (subprotocol
// "mqtt", binary messages) for paho.golang, which needs a net.Conn.
// paho.mqtt.golang dials ws:// and wss:// itself for 3.1.1.
func dialWebSocket(ctx context.Context, raw string, tlsConf *tls.Config) (net.Conn, error) {
	d := websocket.Dialer{TLSClientConfig: tlsConf, Subprotocols: []string{"mqtt"}, Proxy: websocket.DefaultDialer.Proxy}
	c, resp, err := d.DialContext(ctx, raw, nil)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("websocket: %w", err)
	}
	return &wsConn{Conn: c}, nil
}

// wsConn is a WebSocket connection as a byte stream: MQTT packets may span
// WebSocket messages and a message may hold several packets. Reads come
// from paho's one reader; writes are serialised by the packets lock
// (packets.NewThreadSafeConn), as gorilla/websocket requires.
type wsConn struct {
	*websocket.Conn
	r   io.Reader  // the message being read; nil between messages
	wmu sync.Mutex // gorilla reads its write deadline while writing
}

func (c *wsConn) Read(p []byte) (int, error) {
	for {
		if c.r == nil {
			kind, r, err := c.NextReader()
			if err != nil {
				return 0, err
			}
			if kind != websocket.BinaryMessage {
				return 0, fmt.Errorf("websocket: a text message; MQTT uses binary messages")
			}
			c.r = r
		}
		n, err := c.r.Read(p)
		if errors.Is(err, io.EOF) {
			c.r = nil
			if n == 0 {
				continue
			}
			err = nil
		}
		return n, err
	}
}

// Write sends p as one binary message.
func (c *wsConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// SetWriteDeadline also sets the socket's deadline, which ends a write
// already blocked on a peer that stopped reading (gorilla applies its own
// deadline only when a write starts).
func (c *wsConn) SetWriteDeadline(t time.Time) error {
	err := c.UnderlyingConn().SetWriteDeadline(t)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return errors.Join(err, c.Conn.SetWriteDeadline(t))
}

func (c *wsConn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}
