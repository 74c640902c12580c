package mqttin

import "github.com/redpanda-data/benthos/v4/public/service"

// metrics of reliable_mqtt_in. Counters count messages.
type metrics struct {
	received        *service.MetricCounter // PUBLISHes received (retransmissions suppressed excluded)
	acked           *service.MetricCounter // PUBACK/PUBREC sent
	rejected        *service.MetricCounter // attempts the pipeline (or a hook, or the ACK publish) failed
	retried         *service.MetricCounter // rejected deliveries scheduled for another attempt
	duplicates      *service.MetricCounter // retransmissions of a packet still being processed, not delivered again
	unmatched       *service.MetricCounter // matched no topic after replay: acknowledged and dropped
	heldTotal       *service.MetricCounter // unmatched messages held during startup replay
	droppedUnacked  *service.MetricCounter // held messages dropped locally without ack at the replay timeout
	replayOverflows *service.MetricCounter // connections closed fail-closed by session_replay_buffer_size
	qos0Dropped     *service.MetricCounter // QoS 0 messages dropped beyond receive_buffer_size
	malformed       *service.MetricCounter // envelopes that failed to decode (dropped or flagged)
	acksPublished   *service.MetricCounter // end-to-end ACKs published to ack_topic
	ackPublishFails *service.MetricCounter // end-to-end ACKs that could not be published
	held            *service.MetricGauge   // messages held now
	buffered        *service.MetricGauge   // messages waiting for Read, up to receive_buffer_size
	backlog         *service.MetricGauge   // unacknowledged messages beyond receive_buffer_size
}

func newMetrics(m *service.Metrics) *metrics {
	return &metrics{
		received:        m.NewCounter("reliable_mqtt_in_received"),
		acked:           m.NewCounter("reliable_mqtt_in_acked"),
		rejected:        m.NewCounter("reliable_mqtt_in_rejected"),
		retried:         m.NewCounter("reliable_mqtt_in_retried"),
		duplicates:      m.NewCounter("reliable_mqtt_in_duplicates_suppressed"),
		unmatched:       m.NewCounter("reliable_mqtt_in_unmatched_acked"),
		heldTotal:       m.NewCounter("reliable_mqtt_in_replay_held"),
		droppedUnacked:  m.NewCounter("reliable_mqtt_in_replay_dropped_unacked"),
		replayOverflows: m.NewCounter("reliable_mqtt_in_replay_overflows"),
		qos0Dropped:     m.NewCounter("reliable_mqtt_in_qos0_dropped"),
		malformed:       m.NewCounter("reliable_mqtt_in_malformed_envelopes"),
		acksPublished:   m.NewCounter("reliable_mqtt_in_acks_published"),
		ackPublishFails: m.NewCounter("reliable_mqtt_in_ack_publish_failed"),
		held:            m.NewGauge("reliable_mqtt_in_replay_held_now"),
		buffered:        m.NewGauge("reliable_mqtt_in_buffered"),
		backlog:         m.NewGauge("reliable_mqtt_in_backlog"),
	}
}
