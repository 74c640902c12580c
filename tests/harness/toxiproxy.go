package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/collectors"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Link is a WAN link on loopback: a Toxiproxy proxy (github.com/Shopify/
// toxiproxy/v2, run in-process) on 127.0.0.1 in front of one target. Its
// toxics are Toxiproxy's own: latency with jitter, a bandwidth cap, a
// blackhole (`timeout`), resets (`reset_peer`) and `slicer`, each on one
// direction ("upstream": client to target; "downstream": back).
//
// A round trip through a link with Latency(50ms, j) both ways is 100 ms
// ± 2j; Toxiproxy delays each chunk of bytes it reads, in order.
type Link struct {
	t     testing.TB
	proxy *toxiproxy.Proxy
	seq   atomic.Int64
}

// NewLink starts a Toxiproxy proxy on a free 127.0.0.1 port in front of
// target (host:port). It stops at cleanup.
func NewLink(t testing.TB, target string) *Link {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	srv.Metrics.ProxyMetrics = collectors.NewProxyMetricCollectors()
	name := "link-" + randomHex(4)
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", target)
	if err := p.Start(); err != nil {
		t.Fatalf("harness: toxiproxy in front of %s: %v", target, err)
	}
	l := &Link{t: t, proxy: p}
	t.Cleanup(p.Stop)
	return l
}

// Addr is host:port of the link's listener.
func (l *Link) Addr() string { return l.proxy.Listen }

// URL is the link's address as an MQTT broker URL.
func (l *Link) URL() string { return "tcp://" + l.Addr() }

// Toxic names a toxic on a link, to remove it.
type Toxic string

// add adds a toxic of kind on stream ("upstream" or "downstream") with attrs.
func (l *Link) add(kind, stream string, attrs map[string]any) Toxic {
	l.t.Helper()
	name := fmt.Sprintf("%s_%s_%d", kind, stream, l.seq.Add(1))
	body, err := json.Marshal(map[string]any{"name": name, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		l.t.Fatal(err)
	}
	if _, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		l.t.Fatalf("harness: toxic %s on %s: %v", kind, l.Addr(), err)
	}
	return Toxic(name)
}

// Remove removes a toxic; a toxic already gone is not an error.
func (l *Link) Remove(x Toxic) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = l.proxy.Toxics.RemoveToxic(ctx, string(x))
}

// Latency delays every chunk by delay ± jitter in both directions: a round
// trip of 2 × delay.
func (l *Link) Latency(delay, jitter time.Duration) []Toxic {
	attrs := map[string]any{"latency": delay.Milliseconds(), "jitter": jitter.Milliseconds()}
	return []Toxic{l.add("latency", "upstream", attrs), l.add("latency", "downstream", attrs)}
}

// Bandwidth caps each direction at kbytesPerSec KB/s (1 KB = 1000 bytes:
// Toxiproxy's unit).
func (l *Link) Bandwidth(kbytesPerSec int64) []Toxic {
	attrs := map[string]any{"rate": kbytesPerSec}
	return []Toxic{l.add("bandwidth", "upstream", attrs), l.add("bandwidth", "downstream", attrs)}
}

// Blackhole drops every byte in both directions and keeps connections open
// (Toxiproxy's `timeout` toxic with timeout 0), until the toxics are
// removed: a link that went silent. Connections made meanwhile are silent
// too.
func (l *Link) Blackhole() []Toxic {
	attrs := map[string]any{"timeout": 0}
	return []Toxic{l.add("timeout", "upstream", attrs), l.add("timeout", "downstream", attrs)}
}

// ResetPeer resets (TCP RST) every connection through the link at its next
// byte in either direction, and every new one likewise, until the toxics
// are removed.
func (l *Link) ResetPeer() []Toxic {
	attrs := map[string]any{"timeout": 0}
	return []Toxic{l.add("reset_peer", "upstream", attrs), l.add("reset_peer", "downstream", attrs)}
}

// Reset resets the connections through the link: reset_peer for hold,
// long enough for a byte to cross (a keepalive or a publish), then removed.
func (l *Link) Reset(hold time.Duration) {
	xs := l.ResetPeer()
	time.Sleep(hold)
	l.RemoveAll(xs)
}

// Slicer cuts the upstream stream into pieces of about avgBytes ± variation
// sent delay apart.
func (l *Link) Slicer(avgBytes, variation int, delay time.Duration) Toxic {
	return l.add("slicer", "upstream", map[string]any{"average_size": avgBytes, "size_variation": variation, "delay": delay.Microseconds()})
}

// RemoveAll removes toxics.
func (l *Link) RemoveAll(xs []Toxic) {
	for _, x := range xs {
		l.Remove(x)
	}
}
