package mqttin

// warnRetained warns that an envelope arrived retained: the broker sends
// it again at every subscription, so every reconnect or restart forwards
// (or applies) it again, each time as a duplicate of the same event. At
// most one warning per 10 s.
func (i *input) warnRetained(topic, eventID string) {
	if !i.retainedWarn.Allow() {
		return
	}
	i.log.Warnf("Envelope of event %s on %q arrived retained: the broker sends it again at every (re)subscription, so it is delivered again at every reconnect and restart. Publish envelopes without the retain flag, and clear this one with an empty retained message on the topic (mosquitto_pub -r -n -t '%s')", eventID, topic, topic)
}
