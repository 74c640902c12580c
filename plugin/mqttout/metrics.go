package mqttout

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/embedded"
	"github.com/reliable-mqtt/reliable-mqtt/internal/outbox"
)

type metrics struct {
	pending      *service.MetricGauge
	pendingBytes *service.MetricGauge
	oldestAgeMs  *service.MetricGauge
	published    *service.MetricCounter
	confirmed    *service.MetricCounter
	retried      *service.MetricCounter
	ignored      *service.MetricCounter
	latency      *service.MetricTimer
	connected    *service.MetricGauge
	damaged      *service.MetricGauge // records moved aside as damaged, kept in the file
	reasonCodes  *service.MetricCounter
	window       *service.MetricGauge   // records a session may keep unconfirmed now
	written      *service.MetricCounter // bytes bbolt wrote to the outbox file (flash wear)
	storeWritten *service.MetricCounter // bytes the embedded brokers' stores wrote (flash wear)

	// Totals for the periodic log line.
	nPublished, nConfirmed atomic.Int64
}

func newMetrics(m *service.Metrics) *metrics {
	return &metrics{
		pending:      m.NewGauge("reliable_mqtt_out_pending"),
		pendingBytes: m.NewGauge("reliable_mqtt_out_pending_bytes"),
		oldestAgeMs:  m.NewGauge("reliable_mqtt_out_oldest_pending_age_ms"),
		published:    m.NewCounter("reliable_mqtt_out_published"),
		confirmed:    m.NewCounter("reliable_mqtt_out_confirmed"),
		retried:      m.NewCounter("reliable_mqtt_out_retried"),
		ignored:      m.NewCounter("reliable_mqtt_out_acks_ignored", "reason"),
		latency:      m.NewTimer("reliable_mqtt_out_confirm_latency_ns"),
		connected:    m.NewGauge("reliable_mqtt_out_connected"),
		damaged:      m.NewGauge("reliable_mqtt_out_damaged_records"),
		reasonCodes:  m.NewCounter("reliable_mqtt_out_puback_reason_codes", "code"),
		window:       m.NewGauge("reliable_mqtt_out_window"),
		written:      m.NewCounter("reliable_mqtt_out_outbox_written_bytes"),
		storeWritten: m.NewCounter("reliable_mqtt_embedded_store_written_bytes"),
	}
}

// The sender.Metrics methods: what the sender reports.

func (m *metrics) OnPublished() { m.published.Incr(1); m.nPublished.Add(1) }
func (m *metrics) OnRetried()   { m.retried.Incr(1) }
func (m *metrics) OnConfirmed(latency time.Duration) {
	m.confirmed.Incr(1)
	m.nConfirmed.Add(1)
	m.latency.Timing(latency.Nanoseconds())
}
func (m *metrics) OnIgnoredACK(reason string) { m.ignored.Incr(1, reason) }
func (m *metrics) OnReasonCode(code byte)     { m.reasonCodes.Incr(1, fmt.Sprintf("0x%02x", code)) }
func (m *metrics) SetWindow(n int)            { m.window.Set(int64(n)) }
func (m *metrics) SetConnected(up bool) {
	if up {
		m.connected.Set(1)
	} else {
		m.connected.Set(0)
	}
}

// watchOutbox refreshes the outbox gauges once a second and, when every > 0,
// logs a summary line that often, until ctx ends (the outbox's watcher runs
// on its own goroutine).
func (m *metrics) watchOutbox(ctx context.Context, ob *outbox.Outbox, log *service.Logger, every time.Duration) {
	var lastPub, lastConf, lastWritten int64
	ob.Watch(ctx, every, func(st outbox.Stats, report bool) {
		if w := ob.WrittenBytes(); w > lastWritten {
			m.written.Incr(w - lastWritten)
			lastWritten = w
		}
		// The process's embedded brokers: reported by whichever outbox
		// watcher takes them first, each byte once.
		if n := embedded.TakeStoreWritten(); n > 0 {
			m.storeWritten.Incr(n)
		}
		if report {
			pub, conf := m.nPublished.Load(), m.nConfirmed.Load()
			log.Infof("Outbox %s: %d published, %d confirmed in the last %s; %d pending (%d bytes)",
				ob.Path(), pub-lastPub, conf-lastConf, every, st.Pending, st.PendingBytes)
			lastPub, lastConf = pub, conf
		}
		m.pending.Set(int64(st.Pending))
		m.pendingBytes.Set(st.PendingBytes)
		m.damaged.Set(st.Damaged)
		if st.Oldest.IsZero() {
			m.oldestAgeMs.Set(0)
		} else {
			// Enqueue times are wall-clock stamps (a record may come from an
			// earlier run): after a step back the age would be negative.
			m.oldestAgeMs.Set(max(time.Since(st.Oldest).Milliseconds(), 0))
		}
	})
}
