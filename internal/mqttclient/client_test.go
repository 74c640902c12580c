package mqttclient_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
	"github.com/reliable-mqtt/reliable-mqtt/internal/embedded"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

func config(urls ...string) mqttclient.Config {
	return mqttclient.Config{
		URLs:           urls,
		ClientID:       "mqttclient-test",
		KeepAlive:      5 * time.Second,
		ConnectTimeout: 2 * time.Second,
		Reconnect:      backoff.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
	}
}

// eachProtocol runs f once per MQTT protocol version, with a config
// function for it.
func eachProtocol(t *testing.T, f func(t *testing.T, config func(urls ...string) mqttclient.Config)) {
	for _, proto := range []string{mqttclient.V311, mqttclient.V5} {
		t.Run("mqtt"+proto, func(t *testing.T) {
			f(t, func(urls ...string) mqttclient.Config {
				c := config(urls...)
				c.ProtocolVersion = proto
				c.SessionExpiry = mqttclient.SessionExpiryDefault
				return c
			})
		})
	}
}

func waitReady(t *testing.T, c mqttclient.Transport) mqttclient.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := c.WaitReady(ctx)
	if err != nil {
		t.Fatalf("no ready connection: %v", err)
	}
	return conn
}

func closeClient(t *testing.T, c mqttclient.Transport) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Errorf("close: %v", err)
	}
}

func TestReconnectsAfterBrokerRestartWithANewConnAndSessionPresent(t *testing.T) {
	eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{Persistence: true})
		cfg := config(m.URL())
		var connects atomic.Int32
		c, err := embedded.StartClient(cfg, mqttclient.Handlers{
			OnConnect: func(ctx context.Context, conn mqttclient.Conn) error {
				connects.Add(1)
				return conn.Subscribe(ctx, map[string]byte{"t/#": 1})
			},
		}, mqttclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer closeClient(t, c)
		first := waitReady(t, c)
		if first.SessionPresent() {
			t.Fatal("a brand-new persistent session reported session present")
		}
		m.Restart()
		select {
		case <-first.Lost():
		case <-time.After(20 * time.Second):
			t.Fatal("the first connection was not marked lost after the broker restart")
		}
		second := waitReady(t, c)
		if second == first || second.Gen() <= first.Gen() {
			t.Fatalf("reconnect reused connection %d (now %d)", first.Gen(), second.Gen())
		}
		if !second.SessionPresent() {
			t.Fatal("resumed persistent session did not report session present")
		}
		if connects.Load() < 2 {
			t.Fatalf("OnConnect ran %d times, want one per connection", connects.Load())
		}
		if err := first.Publish(context.Background(), mqttmsg.Publication{Event: mqttmsg.Event{Topic: "t/x", Payload: []byte("x")}, QoS: 1}); err == nil {
			t.Fatal("publishing on a lost connection succeeded")
		}
	})
}

func TestOnConnectFailureDropsTheConnectionAndRetries(t *testing.T) {
	eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{})
		var attempts atomic.Int32
		c, err := embedded.StartClient(config(m.URL()), mqttclient.Handlers{
			OnConnect: func(ctx context.Context, conn mqttclient.Conn) error {
				if attempts.Add(1) < 3 {
					return context.DeadlineExceeded
				}
				return nil
			},
		}, mqttclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer closeClient(t, c)
		conn := waitReady(t, c)
		if attempts.Load() != 3 || conn.Gen() != 3 {
			t.Fatalf("ready after %d attempts on connection %d, want the third", attempts.Load(), conn.Gen())
		}
	})
}

func TestMessagesArriveInOrderOnTheHandler(t *testing.T) {
	eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
		for _, tc := range []struct{ name, url string }{
			{"mosquitto", ""},
			{"embedded", "embedded://?dir="},
		} {
			t.Run(tc.name, func(t *testing.T) {
				url := tc.url
				if url == "" {
					url = harness.StartMosquitto(t, harness.MosquittoOptions{}).URL()
				} else {
					url += filepath.Join(t.TempDir(), "broker")
				}
				var got []string
				done := make(chan struct{})
				c, err := embedded.StartClient(config(url), mqttclient.Handlers{
					OnConnect: func(ctx context.Context, conn mqttclient.Conn) error {
						return conn.Subscribe(ctx, map[string]byte{"order": 1})
					},
					OnMessage: func(_ mqttclient.Conn, m mqttmsg.Message) {
						got = append(got, string(m.Payload()))
						if len(got) == 100 {
							close(done)
						}
					},
				}, mqttclient.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer closeClient(t, c)
				conn := waitReady(t, c)
				for i := 0; i < 100; i++ {
					if err := conn.Publish(context.Background(), mqttmsg.Publication{Event: mqttmsg.Event{Topic: "order", Payload: []byte{byte('0' + i%10)}}, QoS: 1}); err != nil {
						t.Fatal(err)
					}
				}
				select {
				case <-done:
				case <-time.After(20 * time.Second):
					t.Fatalf("received %d of 100", len(got))
				}
				for i, p := range got {
					if p != string(rune('0'+i%10)) {
						t.Fatalf("message %d out of order: %q", i, p)
					}
				}
			})
		}
	})
}

func TestCloseIsBoundedWhileTheBrokerIsUnreachable(t *testing.T) {
	eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
		c, err := embedded.StartClient(config("tcp://127.0.0.1:1"), mqttclient.Handlers{}, mqttclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		closeUnbounded(t, c, "while the broker is unreachable")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := c.WaitReady(ctx); err != mqttclient.ErrClosed {
			t.Fatalf("WaitReady after Close: %v, want ErrClosed", err)
		}
	})
}

// A broker that stops answering does not hold Close (v5: the DISCONNECT's
// wait for the broker is bounded).
func TestCloseIsBoundedWhileTheBrokerStalls(t *testing.T) {
	eachProtocol(t, func(t *testing.T, config func(urls ...string) mqttclient.Config) {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{})
		proxy := harness.NewProxy(t, m.Addr())
		c, err := embedded.StartClient(config(proxy.URL()), mqttclient.Handlers{}, mqttclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		waitReady(t, c)
		proxy.Stall()
		closeUnbounded(t, c, "while the broker stalls")
	})
}

func TestConfigValidationNamesTheProblem(t *testing.T) {
	cases := map[string]func(*mqttclient.Config){
		"at least one broker URL": func(c *mqttclient.Config) { c.URLs = nil },
		"has scheme \"http\"":     func(c *mqttclient.Config) { c.URLs = []string{"http://x"} },
		"will.topic":              func(c *mqttclient.Config) { c.Will = &mqttclient.Will{} },
		"connect_timeout":         func(c *mqttclient.Config) { c.ConnectTimeout = 0 },
		"reconnect_backoff":       func(c *mqttclient.Config) { c.Reconnect.Max = time.Millisecond },
		"protocol_version":        func(c *mqttclient.Config) { c.ProtocolVersion = "4" },
	}
	for want, mutate := range cases {
		c := config("tcp://127.0.0.1:1883")
		mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error mentioning %q", err, want)
		}
	}
}

// closeUnbounded closes c with a context without deadline, as Benthos
// gives it: Close must return by itself. 30 s is a wait bound, not a speed
// target.
func closeUnbounded(t *testing.T, c mqttclient.Transport, while string) {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return " + while)
	}
}

func startClient(cfg mqttclient.Config) (mqttclient.Transport, error) {
	return embedded.StartClient(cfg, mqttclient.Handlers{}, mqttclient.Options{})
}
