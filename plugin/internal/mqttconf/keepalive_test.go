package mqttconf_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttclient"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/mqttconf"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// With the default keepalive, a broker that goes silent (a black hole: the
// connection stays open, nothing answers) is noticed within 15 s with no
// traffic, and the client is connected again within 30 s of its return,
// with the default reconnect backoff. (docs/operations.md, "Readiness".)
func TestSilentBrokerIsNoticedWithin15sWithDefaults(t *testing.T) {
	for _, proto := range []string{mqttclient.V311, mqttclient.V5} {
		t.Run("mqtt"+proto, func(t *testing.T) {
			m := harness.StartMosquitto(t, harness.MosquittoOptions{})
			proxy := harness.NewProxy(t, m.Addr())
			spec := service.NewConfigSpec().Fields(mqttconf.ConnectionFields()...)
			pc, err := spec.ParseYAML(fmt.Sprintf("urls: [ %q ]\nprotocol_version: %q\n", proxy.URL(), proto), nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := mqttconf.ParseConfig(pc)
			if err != nil {
				t.Fatal(err)
			}
			cfg.ClientID = "silent-" + proto
			c, err := mqttclient.Start(cfg, mqttclient.Handlers{}, mqttclient.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := c.Close(ctx); err != nil {
					t.Errorf("close: %v", err)
				}
			}()
			ready, cancelReady := context.WithTimeout(context.Background(), 20*time.Second)
			conn, err := c.WaitReady(ready)
			cancelReady()
			if err != nil {
				t.Fatalf("no ready connection: %v", err)
			}

			proxy.Stall()
			stalled := time.Now()
			select {
			case <-conn.Lost():
				t.Logf("silent broker noticed after %s", time.Since(stalled).Round(100*time.Millisecond))
			case <-time.After(15 * time.Second):
				t.Fatal("a silent broker went unnoticed for 15 s with the default keepalive")
			}
			proxy.Restore()
			back := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := c.WaitReady(ctx); err != nil {
				t.Fatalf("not connected again within 30 s of the broker's return: %v", err)
			}
			t.Logf("connected again after %s", time.Since(back).Round(100*time.Millisecond))
		})
	}
}
