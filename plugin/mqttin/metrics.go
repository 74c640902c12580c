package mqttin

import (
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/inbox"
)

// metrics of reliable_mqtt_in. Counters count messages.
type metrics struct {
	inbox     inbox.Metrics        // routing, replay, queue and broker acknowledgements
	connected *service.MetricGauge // 1 while a connection with its subscriptions is ready
}

func (m *metrics) setConnected(up bool) {
	if up {
		m.connected.Set(1)
	} else {
		m.connected.Set(0)
	}
}

func newMetrics(m *service.Metrics) *metrics {
	return &metrics{
		inbox: inbox.Metrics{
			Received:        m.NewCounter("reliable_mqtt_in_received"),
			Acked:           m.NewCounter("reliable_mqtt_in_acked"),
			Retried:         m.NewCounter("reliable_mqtt_in_retried"),
			Duplicates:      m.NewCounter("reliable_mqtt_in_duplicates_suppressed"),
			Unmatched:       m.NewCounter("reliable_mqtt_in_unmatched_acked"),
			HeldTotal:       m.NewCounter("reliable_mqtt_in_replay_held"),
			DroppedUnacked:  m.NewCounter("reliable_mqtt_in_replay_dropped_unacked"),
			ReplayOverflows: m.NewCounter("reliable_mqtt_in_replay_overflows"),
			QoS0Dropped:     m.NewCounter("reliable_mqtt_in_qos0_dropped"),
			Held:            m.NewGauge("reliable_mqtt_in_replay_held_now"),
			Buffered:        m.NewGauge("reliable_mqtt_in_buffered"),
			Backlog:         m.NewGauge("reliable_mqtt_in_backlog"),
			Rejected:        m.NewCounter("reliable_mqtt_in_rejected"),
			Malformed:       m.NewCounter("reliable_mqtt_in_malformed_envelopes"),
			AcksPublished:   m.NewCounter("reliable_mqtt_in_acks_published"),
			AckPublishFails: m.NewCounter("reliable_mqtt_in_ack_publish_failed"),
		},
		connected: m.NewGauge("reliable_mqtt_in_connected"),
	}
}
